"""One module per DVC stage: ``run(ctx) -> summary``; no stage imports another (shared code
lives outside this package, and in :mod:`acrb.stages.context`)."""
