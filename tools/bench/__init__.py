"""The benchmark of the FlashInfer Hopper ops (the main job): `python tools/bench --help`."""
