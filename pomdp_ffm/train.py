"""Hydra entry point: ``python -m pomdp_ffm.train env=HopperBLT-V-v0 algo=td3 seq_model=ffm seed=0``.

``--cfg job`` prints the composed config; ``resume=true hydra.run.dir=<run>`` continues a killed run.
"""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .config import RunConfig, register_configs
from .trainer import Trainer

register_configs()
log = logging.getLogger("pomdp_ffm")


def run(cfg: DictConfig, run_dir: Path) -> dict:
    run_cfg: RunConfig = OmegaConf.to_object(cfg)  # validates choices (dataclass __post_init__)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "config.yaml"
    if not (run_cfg.resume and cfg_path.exists()):
        cfg_path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    trainer = Trainer(run_cfg, run_dir)
    try:
        return trainer.run()
    finally:
        trainer.close()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
