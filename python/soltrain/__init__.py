"""soltrain: fast training and fine-tuning of language models, from Python or YAML.

    import soltrain
    config = soltrain.SFTConfig(model="runs/demo-data/model", output_dir="runs/py", max_steps=100)
    trainer = soltrain.Trainer(config, train_dataset=[{"messages": [...]}, ...])
    trainer.train()

The engine is soltrain's C++/CUDA core (the `soltrain` command runs the same): a config here is the YAML
file's keys as keyword arguments, and a run from Python is the run `soltrain sft config.yaml` makes.
"""
from ._native import ConfigError, DataError, SoltrainError
from .config import (DPOConfig, GRPOConfig, KTOConfig, ORPOConfig, PRMConfig, PTConfig, RewardConfig, SFTConfig,
                     TrainConfig)
from .model import Model
from .tokenizer import Tokenizer
from .trainer import GRPOTrainer, Trainer, TrainerCallback, TrainOutput

__all__ = [
    "ConfigError",
    "DataError",
    "DPOConfig",
    "KTOConfig",
    "ORPOConfig",
    "GRPOConfig",
    "GRPOTrainer",
    "Model",
    "PTConfig",
    "PRMConfig",
    "RewardConfig",
    "SFTConfig",
    "SoltrainError",
    "Tokenizer",
    "TrainConfig",
    "Trainer",
    "TrainerCallback",
    "TrainOutput",
]
