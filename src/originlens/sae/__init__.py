"""Sparse autoencoders: the :class:`SAE` module (standard / JumpReLU / TopK), SAELens' on-disk format
(:func:`read_sae`, :func:`write_sae`) and training on a residual site of any LM adapter
(:func:`train_sae`)."""

from .format import config_from_dict, config_to_dict, is_sae_dir, read_config, read_sae, write_sae
from .model import ARCHITECTURES, SAE, SAEConfig, sae_site
from .train import SAETrainConfig, SAETrainResult, train_sae, train_sae_on_activations, train_sae_run

__all__ = [
    "ARCHITECTURES",
    "SAE",
    "SAEConfig",
    "SAETrainConfig",
    "SAETrainResult",
    "config_from_dict",
    "config_to_dict",
    "is_sae_dir",
    "read_config",
    "read_sae",
    "sae_site",
    "train_sae",
    "train_sae_on_activations",
    "train_sae_run",
    "write_sae",
]
