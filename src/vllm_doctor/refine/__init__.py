"""Refine hooks: "which rule is this match really?" A rule names one as `refine = "module:function"`
(a module of this package); the hook gets a findings.RefineContext and returns another rule id, or None
to keep the match's own."""
