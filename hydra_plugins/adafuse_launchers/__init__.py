"""Our Hydra launchers; Hydra loads launchers only from the hydra_plugins namespace."""
