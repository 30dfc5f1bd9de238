"""Gymnasium's classic-control environments as numpy over a batch: many copies of one environment
stepped by one set of array operations, each copy's observations, rewards and terminations equal
to the plain Gymnasium environment's bit for bit.

Each ``step`` transcribes its environment's Python step onto arrays in the same order of
operations and in the same dtypes. numpy 2 promotes a Python float against a float32 value to
float32 (NEP 50), so the float32 arithmetic of MountainCarContinuous and Pendulum is kept where
Gymnasium has it; ``math.cos`` of a double equals ``np.cos`` of that double; a scalar's ``** 2``
is libm's ``pow`` (:func:`_squared`). Constants are read from an instance of the environment, so
a changed default follows Gymnasium. tests/core/evolve/control/test_dynamics.py steps each one
beside ``gymnasium.make(id)``.

A batch starts from states taken from the environment itself (``reset(seed)``, see
:mod:`.environments`), so the starting draws are Gymnasium's own.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np


class BatchDynamics:
    """``n`` copies of one environment: ``state`` ``[n, k]`` (the environment's own state, what
    frames are drawn from), :meth:`observe`, :meth:`step`, and :meth:`keep` to drop finished copies."""

    env_id: ClassVar[str]

    def __init__(self, env: Any, states: np.ndarray):
        self.env = env  # the unwrapped Gymnasium environment: its constants
        self.state = np.array(states)

    def keep(self, rows: np.ndarray) -> None:
        """Keep only the copies ``rows`` (indices, in order)."""
        self.state = self.state[rows]

    def close(self) -> None:
        """Nothing to release: the copies are arrays (a batch of Gymnasium environments closes them)."""

    def observe(self) -> np.ndarray:
        """Each copy's observation, float32 ``[n, obs]``."""
        return self.state.astype(np.float32)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Advance every copy by its action: ``(rewards float64 [n], terminated bool [n])``."""
        raise NotImplementedError


class CartPole(BatchDynamics):
    env_id = "CartPole-v1"

    def step(self, actions):
        e = self.env
        x, x_dot, theta, theta_dot = self.state.T
        force = np.where(actions == 1, e.force_mag, -e.force_mag)
        costheta, sintheta = np.cos(theta), np.sin(theta)
        temp = (force + e.polemass_length * np.square(theta_dot) * sintheta) / e.total_mass
        thetaacc = (e.gravity * sintheta - costheta * temp) / (
            e.length * (4.0 / 3.0 - e.masspole * np.square(costheta) / e.total_mass))
        xacc = temp - e.polemass_length * thetaacc * costheta / e.total_mass
        if e.kinematics_integrator == "euler":
            x = x + e.tau * x_dot
            x_dot = x_dot + e.tau * xacc
            theta = theta + e.tau * theta_dot
            theta_dot = theta_dot + e.tau * thetaacc
        else:
            x_dot = x_dot + e.tau * xacc
            x = x + e.tau * x_dot
            theta_dot = theta_dot + e.tau * thetaacc
            theta = theta + e.tau * theta_dot
        self.state = np.stack([x, x_dot, theta, theta_dot], axis=1)
        terminated = ((x < -e.x_threshold) | (x > e.x_threshold)
                      | (theta < -e.theta_threshold_radians) | (theta > e.theta_threshold_radians))
        # the step that ends an episode still earns its 1 (Sutton and Barto's variant: 0 and -1)
        if e._sutton_barto_reward:
            return np.where(terminated, -1.0, 0.0), terminated
        return np.ones(len(x)), terminated


class Acrobot(BatchDynamics):
    env_id = "Acrobot-v1"

    def observe(self):
        s = self.state
        return np.stack([np.cos(s[:, 0]), np.sin(s[:, 0]), np.cos(s[:, 1]), np.sin(s[:, 1]),
                         s[:, 2], s[:, 3]], axis=1).astype(np.float32)

    def step(self, actions):
        e = self.env
        torque = np.asarray(e.AVAIL_TORQUE, np.float64)[actions]
        augmented = np.concatenate([self.state.astype(np.float64), torque[:, None]], axis=1)
        dt = e.dt  # rk4 over [0, dt]: one step
        k1 = self._dsdt(augmented)
        k2 = self._dsdt(augmented + dt / 2.0 * k1)
        k3 = self._dsdt(augmented + dt / 2.0 * k2)
        k4 = self._dsdt(augmented + dt * k3)
        ns = (augmented + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4))[:, :4]
        ns[:, 0] = _wrap(ns[:, 0], -np.pi, np.pi)
        ns[:, 1] = _wrap(ns[:, 1], -np.pi, np.pi)
        ns[:, 2] = _bound(ns[:, 2], -e.MAX_VEL_1, e.MAX_VEL_1)
        ns[:, 3] = _bound(ns[:, 3], -e.MAX_VEL_2, e.MAX_VEL_2)
        self.state = ns
        terminated = -np.cos(ns[:, 0]) - np.cos(ns[:, 1] + ns[:, 0]) > 1.0
        return np.where(terminated, 0.0, -1.0), terminated

    def _dsdt(self, s):
        """Gymnasium's ``AcrobotEnv._dsdt`` over rows: the same expressions, in the same order."""
        e = self.env
        m1, m2, l1 = e.LINK_MASS_1, e.LINK_MASS_2, e.LINK_LENGTH_1
        lc1, lc2, I1, I2 = e.LINK_COM_POS_1, e.LINK_COM_POS_2, e.LINK_MOI, e.LINK_MOI
        g, pi, cos, sin = 9.8, np.pi, np.cos, np.sin
        a = s[:, -1]
        theta1, theta2, dtheta1, dtheta2 = s[:, 0], s[:, 1], s[:, 2], s[:, 3]
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos(theta2)) + I1 + I2
        d2 = m2 * (lc2**2 + l1 * lc2 * cos(theta2)) + I2
        phi2 = m2 * lc2 * g * cos(theta1 + theta2 - pi / 2.0)
        phi1 = (-m2 * l1 * lc2 * _squared(dtheta2) * sin(theta2)
                - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin(theta2)
                + (m1 * lc1 + m2 * l1) * g * cos(theta1 - pi / 2)
                + phi2)
        if e.book_or_nips == "nips":
            ddtheta2 = (a + d2 / d1 * phi1 - phi2) / (m2 * lc2**2 + I2 - _squared(d2) / d1)
        else:
            ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * _squared(dtheta1) * sin(theta2) - phi2) / (
                m2 * lc2**2 + I2 - _squared(d2) / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return np.stack([dtheta1, dtheta2, ddtheta1, ddtheta2, np.zeros_like(a)], axis=1)


class MountainCar(BatchDynamics):
    env_id = "MountainCar-v0"

    def step(self, actions):
        e = self.env
        position, velocity = self.state[:, 0], self.state[:, 1]
        velocity = velocity + ((actions - 1) * e.force + np.cos(3 * position) * (-e.gravity))
        velocity = np.clip(velocity, -e.max_speed, e.max_speed)
        position = np.clip(position + velocity, e.min_position, e.max_position)
        velocity = np.where((position == e.min_position) & (velocity < 0), 0.0, velocity)
        terminated = (position >= e.goal_position) & (velocity >= e.goal_velocity)
        self.state = np.stack([position, velocity], axis=1)
        return np.full(len(position), -1.0), terminated


class MountainCarContinuous(BatchDynamics):
    """The state is float32 after the first step (float64 from ``reset``), and the force is
    float32 unless the action was clipped, when Python's ``min``/``max`` return a Python float
    and that step's arithmetic is double: both kept."""

    env_id = "MountainCarContinuous-v0"

    def step(self, actions):
        e = self.env
        a = actions[:, 0].astype(np.float32)
        dtype = self.state.dtype  # float64 on the first step, float32 after
        position, velocity = self.state[:, 0], self.state[:, 1]
        cos = np.cos((3 * position).astype(np.float64))  # 3 * position in its dtype, then math.cos
        low, high = e.min_action > a, e.max_action < np.where(e.min_action > a, e.min_action, a)
        clipped = low | high
        push32 = a * np.float32(e.power) - (0.0025 * cos).astype(np.float32)  # float32 arithmetic
        push64 = np.where(low, e.min_action, e.max_action) * e.power - 0.0025 * cos
        if dtype == np.float64:
            velocity = velocity + np.where(clipped, push64, push32.astype(np.float64))
        else:  # a float32 plus a Python float: the float rounded to float32 first
            velocity = velocity + np.where(clipped, push64.astype(np.float32), push32)
        velocity = np.where(velocity > e.max_speed, np.asarray(e.max_speed, dtype), velocity)
        velocity = np.where(velocity < -e.max_speed, np.asarray(-e.max_speed, dtype), velocity)
        position = position + velocity
        position = np.where(position > e.max_position, np.asarray(e.max_position, dtype), position)
        position = np.where(position < e.min_position, np.asarray(e.min_position, dtype), position)
        velocity = np.where((position == np.asarray(e.min_position, dtype)) & (velocity < 0),
                            np.asarray(0, dtype), velocity)
        terminated = (position >= np.asarray(e.goal_position, dtype)) & (velocity >= e.goal_velocity)
        reward = np.where(terminated, 100.0, 0.0) - np.square(a.astype(np.float64)) * 0.1
        self.state = np.stack([position, velocity], axis=1).astype(np.float32)
        return reward, terminated


class Pendulum(BatchDynamics):
    env_id = "Pendulum-v1"

    def observe(self):
        th, thdot = self.state[:, 0], self.state[:, 1]
        return np.stack([np.cos(th), np.sin(th), thdot], axis=1).astype(np.float32)

    def step(self, actions):
        e = self.env
        th, thdot = self.state[:, 0], self.state[:, 1]
        g, m, l, dt = e.g, e.m, e.l, e.dt  # noqa: E741 (Gymnasium's names)
        u = np.clip(actions[:, 0].astype(np.float32), -e.max_torque, e.max_torque)
        normalized = ((th + np.pi) % (2 * np.pi)) - np.pi
        costs = _squared(normalized) + 0.1 * _squared(thdot) + 0.001 * _squared(u)
        newthdot = thdot + (3 * g / (2 * l) * np.sin(th) + 3.0 / (m * l**2) * u) * dt
        newthdot = np.clip(newthdot, -e.max_speed, e.max_speed)
        self.state = np.stack([th + newthdot * dt, newthdot], axis=1)
        return -costs, np.zeros(len(th), bool)


def _squared(x: np.ndarray) -> np.ndarray:
    """``x ** 2`` as Gymnasium's scalar code computes it: a numpy scalar's power calls libm's
    ``pow``, which differs from ``x * x`` (what an array's ``** 2`` computes) in about one value
    in a thousand."""
    return np.power(x, np.full_like(x, 2))


def _wrap(x: np.ndarray, m: float, big: float) -> np.ndarray:
    """Gymnasium's ``wrap``: subtract or add the range until ``m <= x <= big``, a turn at a time."""
    diff = big - m
    while (above := x > big).any():
        x = np.where(above, x - diff, x)
    while (below := x < m).any():
        x = np.where(below, x + diff, x)
    return x


def _bound(x: np.ndarray, m: float, big: float) -> np.ndarray:
    """Gymnasium's ``bound``, ``min(max(x, m), big)`` with Python's ``max`` and ``min``."""
    x = np.where(m > x, m, x)
    return np.where(big < x, big, x)


#: the environments with batched dynamics, by Gymnasium id
DYNAMICS: dict[str, type[BatchDynamics]] = {
    cls.env_id: cls for cls in (CartPole, Acrobot, MountainCar, MountainCarContinuous, Pendulum)}
