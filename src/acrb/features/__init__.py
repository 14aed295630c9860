"""Feature prompts p_feat per source portrait, for the feature-prompt arm.

Three describers write the seven observable descriptions of :data:`acrb.records.
FEATURE_DIMENSIONS`: a vision-language model (:mod:`acrb.features.describe`), the offline pixel
reader of the embedded default (:mod:`acrb.features.simulated`), or a published mapping
(:mod:`acrb.features.mapping`). Every feature prompt passes the demographic label check of
:mod:`acrb.features.labels`. The ``features`` stage (:mod:`acrb.stages.features`) writes them.
"""
