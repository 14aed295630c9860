"""Model adapters behind the Editor protocol (:mod:`acrb.models.base`), found through
:data:`acrb.registry.EDITORS`; the simulated editors of the embedded default."""
