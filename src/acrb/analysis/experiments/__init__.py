"""The study's experiments: the feature-prompt arm (:mod:`.arms`), WinoBias pairs
(:mod:`.winobias`), text-to-image refusal by prompt attribute (:mod:`.attributes`) and the
stereotype congruence score (:mod:`.congruence`)."""
