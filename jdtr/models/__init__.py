"""Reference models, shared by tests, benchmarks and notebooks: in plain JAX
(`jax_models`) and in Flax NNX (`flax_models`: `batchnorm_cnn`, `flax_gpt`,
`flax_gpt_megatron` (placed on a mesh), `flax_resnet_groupnorm`, `flax_unet`,
`flax_unet3`, `flax_scan_lstm`, `flax_scan_gpt` and `flax_tied_lm`,
which import flax and optax when called).

Layer 0 of docs/design.md's map: public, for users to try jdtr on, but not
part of the library's machinery (nothing under `jdtr/` imports it).

Each factory returns a `Model`: a scalar loss `loss(params, batch)`, and
initial params and a batch built from a seed. Sizes are arguments, so tests
use small ones and benchmarks large ones.
"""

from .flax_models import (
    batchnorm_cnn, flax_gpt, flax_gpt_megatron, flax_resnet_groupnorm, flax_scan_gpt, flax_scan_lstm, flax_tied_lm, flax_unet,
    flax_unet3,
)
from .jax_models import (
    Model,
    Segment,
    fourier_operator,
    gated_mlp,
    linear_recurrence,
    megatron_shard_map,
    message_passing,
    mlp_chain,
    plain_cnn,
    resnet,
    rnn,
    sorted_layers,
    stacked_lstm,
    transformer,
    wavenet,
)

__all__ = [
    "Model", "Segment", "batchnorm_cnn", "flax_gpt", "flax_gpt_megatron", "flax_resnet_groupnorm", "flax_scan_gpt", "flax_scan_lstm",
    "flax_tied_lm", "flax_unet", "flax_unet3", "fourier_operator", "gated_mlp", "linear_recurrence", "megatron_shard_map", "message_passing", "mlp_chain", "plain_cnn", "resnet", "rnn", "sorted_layers",
    "stacked_lstm", "transformer", "wavenet",
]
