"""A Hydra app in the lightning-hydra-template's layout: config groups, instantiate, Trainer.fit."""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> None:
    datamodule = hydra.utils.instantiate(cfg.data)
    model = hydra.utils.instantiate(cfg.model)
    trainer = hydra.utils.instantiate(cfg.trainer)
    trainer.fit(model=model, datamodule=datamodule)


if __name__ == "__main__":
    main()
