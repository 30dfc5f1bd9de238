"""Networks changed the ways NEAT changes them (spec §7.4, §7.5), for tests of batched evaluation
and tasks: new activations, disabled layers, layers re-initialised as another type at size d,
remote-link children on a Dense, morphed dtypes and perturbed weights."""

from __future__ import annotations

import numpy as np

from loomlab.core import VolumetricNetwork, make_layer
from loomlab.core.morph import morph_layer

ACTIVATIONS = ["ReLU", "Silu", "GELU", "Tanh", "Sigmoid", "Linear", "LeakyReLU", "ReLU2"]
DTYPES = ["float16", "bfloat16", "int8", "fp4", "uint8", "ternary"]
# §7.5's re-initialisation of the types our engine builds at input_height = output_height = d
OTHER_TYPES = {
    "RNN": lambda d: {"input_channels": d, "seq_length": 1},
    "LSTM": lambda d: {"input_channels": d, "seq_length": 1},
    "SwiGLU": lambda d: {"output_height": 2 * d},
    "RMSNorm": lambda d: {},
    "LayerNorm": lambda d: {},
    "MultiHeadAttention": lambda d: {"num_heads": 1, "head_dim": d, "num_kv_heads": 1, "d_model": d,
                                     "seq_length": 1},
    "CNN1": lambda d: {"input_channels": 1, "filters": 1, "kernel_size": 3},
    "Embedding": lambda d: {"vocab_size": 256, "embedding_dim": d, "input_height": 256},
    "KMeans": lambda d: {"num_clusters": 8, "kmeans_temperature": 1.0, "output_mode": "probabilities",
                         "output_height": 8},
    "Softmax": lambda d: {},
    "Residual": lambda d: {},
}


def mlp(sizes: list[int], rng: np.random.Generator, activation: str = "Tanh", *,
        precision: str = "loom") -> VolumetricNetwork:
    net = VolumetricNetwork(1, 1, 1, len(sizes) - 1, precision=precision)
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:], strict=False)):
        net[0, 0, 0, i] = make_layer("Dense", input_height=n_in, output_height=n_out, activation=activation,
                                     rng=rng, init_scale=0.8)
    return net


def mutate(net: VolumetricNetwork, rng: np.random.Generator, d: int, rate: float = 0.3) -> VolumetricNetwork:
    """Change ``net`` in place: each layer, each change with probability ``rate``."""
    for i, layer in list(enumerate(net.cells)):
        if rng.random() < rate and layer.weights is not None:
            layer.weights.master += rng.uniform(-0.05, 0.05, len(layer.weights)).astype(np.float32)
            layer.weights.touch()
        if rng.random() < rate:
            layer.cfg.activation = str(rng.choice(ACTIVATIONS))
        if rng.random() < rate / 2:
            layer.cfg.is_disabled = not layer.cfg.is_disabled
        if rng.random() < rate and layer.weights is not None:
            morph_layer(net, i, str(rng.choice(DTYPES)))
        if rng.random() < rate / 3:
            type_name = str(rng.choice(sorted(OTHER_TYPES)))
            fields = {"input_height": d, "output_height": d, **OTHER_TYPES[type_name](d)}
            net[net.coord(i)] = make_layer(type_name, rng=rng, init_scale=0.05, **fields)
    if rng.random() < rate:
        add_remote_link(net, rng)
    return net


def add_remote_link(net: VolumetricNetwork, rng: np.random.Generator) -> None:
    """ConnectionAdd (§7.4): a remote-link child on layer a targeting layer b; on a layer that is not
    Parallel it has no forward effect."""
    a, b = rng.choice(len(net.cells), 2, replace=False)
    target = net.coord(int(b))
    child = make_layer("Dense", input_height=1, output_height=1, is_remote_link=True,
                       target_z=target[0], target_y=target[1], target_x=target[2], target_l=target[3])
    host = net.cells[int(a)]
    host.children.append(child)
    if not host.cfg.combine_mode:
        host.cfg.combine_mode = "add"
