"""The pattern operator's family: row pattern recognition (SQL's MATCH_RECOGNIZE) in the executor.

`row_eval` evaluates a pattern's conditions and measures on rows; `match` is the per-key
automaton (`KeyMatcher`, partial matches bounded by `max-partial-matches`); `stage` runs one stage
of a pattern pipelined over k stages (the paper's Figure 8); `spark` puts matchers into Spark's
state store (`pattern_frame`, `stage_frame`). Only `spark` imports pyspark, so the matching is
pure and testable without a session.
"""
