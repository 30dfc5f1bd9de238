"""Central finite-difference checks of a network's backward pass, in float64.

The oracle: for a random projection ``L = sum(R * net(x))`` the analytic dL/dx and dL/dparams
from ``backward`` must match ``(L(v+h) - L(v-h)) / 2h`` for every input element and every
parameter of every weighted layer. Parameters are perturbed in float64 by substituting each
layer's parameter vector (the float32 master cannot hold a 1e-6 step).
"""

from __future__ import annotations

import numpy as np

from loomlab.core import VolumetricNetwork

STEP = 1e-6


def rel_error(a, b) -> float:
    a, b = np.ravel(a), np.ravel(b)
    scale = max(np.linalg.norm(a), np.linalg.norm(b), 1e-12)
    return float(np.linalg.norm(a - b) / scale)


def _use_float64_params(net: VolumetricNetwork) -> dict:
    thetas = {}
    for layer in net.weighted_layers():
        theta = layer.weights.master.astype(np.float64)
        # instance override; xp.asarray is theta itself on numpy, a device copy elsewhere
        layer.params = (lambda t: (lambda xp, dtype: xp.asarray(t)))(theta)
        thetas[id(layer)] = (layer, theta)
    return thetas


def check_gradients(net: VolumetricNetwork, x, *, seed: int = 0, max_params: int = 400,
                    prepare=None) -> dict[str, float]:
    """Relative errors of dL/dx and of each weighted layer's dL/dparams.

    ``prepare()`` is called before every forward (e.g. to reset stateful layers); a random
    subset of at most ``max_params`` parameters per layer is probed.
    """
    rng = np.random.default_rng(seed)
    x = np.asarray(x, dtype=np.float64)
    thetas = _use_float64_params(net)

    def loss(xv):
        if prepare:
            prepare()
        return float(np.sum(r * net.backend.to_numpy(net.forward(xv))))

    if prepare:
        prepare()
    y = net.forward(x, train=True)
    r = rng.standard_normal(y.shape)
    net.zero_grad()
    gx = net.backend.to_numpy(net.backward(r))

    errors = {}
    num = np.zeros(x.size)
    for i in range(x.size):
        xp_, xm = x.copy().reshape(-1), x.copy().reshape(-1)
        xp_[i] += STEP
        xm[i] -= STEP
        num[i] = (loss(xp_.reshape(x.shape)) - loss(xm.reshape(x.shape))) / (2 * STEP)
    errors["input"] = rel_error(gx, num)

    for n, (layer, theta) in enumerate(thetas.values()):
        idx = np.arange(theta.size)
        if theta.size > max_params:
            idx = rng.choice(theta.size, max_params, replace=False)
        ana = np.zeros(idx.size) if layer.grad is None else layer.grad[idx]
        num = np.zeros(idx.size)
        for k, i in enumerate(idx):
            old = theta[i]
            theta[i] = old + STEP
            lp = loss(x)
            theta[i] = old - STEP
            lm = loss(x)
            theta[i] = old
            num[k] = (lp - lm) / (2 * STEP)
        errors[f"params[{n}]:{layer.type_name}"] = rel_error(ana, num)
    return errors


def assert_gradients(net, x, tol: float = 1e-5, **kw) -> dict[str, float]:
    errors = check_gradients(net, x, **kw)
    bad = {k: v for k, v in errors.items() if not v < tol}
    assert not bad, f"gradient mismatch (relative error >= {tol}): {bad}"
    return errors


def single(layer, backend: str = "numpy") -> VolumetricNetwork:
    """A 1x1x1x1 network holding ``layer``."""
    net = VolumetricNetwork(1, 1, 1, 1, backend=backend)
    net[0, 0, 0, 0] = layer
    return net
