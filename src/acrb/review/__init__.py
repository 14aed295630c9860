"""Human review: the rating app (`acrb review serve`), its store and exports, and the import
of an existing survey's export. The review set is drawn by the ``review_set`` stage and the
ratings are analysed by the ``review`` stage (:mod:`acrb.stages.review`)."""
