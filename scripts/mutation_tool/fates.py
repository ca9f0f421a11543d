"""Survivors of the whole CI, each with its fate: ("new test", the test that kills it now) or
("equivalent", the probe that shows no input tells it apart). Keyed ``module:operator:occurrence``
of the run's commit (results/mutation/tool/score.json)."""

FATES: dict[str, tuple[str, str]] = {}
