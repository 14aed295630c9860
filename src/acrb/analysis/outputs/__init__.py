"""What the analysis writes and shows, and nothing it computes: one model's tables and figures
assembled (:mod:`.section`), figures (:mod:`.figures`, :mod:`.dvc_plots`, kept by
:mod:`.figure_cache`), the report (:mod:`.report`, :mod:`.review_report`, :mod:`.findings`),
the paper's tables (:mod:`.paper_tables`, :mod:`.latex`) and the headline metrics
(:mod:`.headline`). The statistics never import this package."""
