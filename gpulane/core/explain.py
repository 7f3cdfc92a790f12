"""Plain-language explanations of the dispatcher's decisions, for Events, logs and the CLI."""

from __future__ import annotations

from gpulane.core.events import Dispatch
from gpulane.core.score import ScoreBreakdown

# How each term is named when it changed the winner.
TERM_NAMES = {"aging": "aging", "affinity": "swap affinity", "fairShare": "fair share"}


def format_score(score: ScoreBreakdown) -> str:
    """``112.5 = priority 100 + tier 2 + affinity 10 + aging 0.5``."""
    return (
        f"{score.total:.1f} = priority {score.priority} + tier {score.tier} + affinity {score.affinity}"
        f" + aging {score.aging:.1f}"
    )


def describe_dispatch(decision: Dispatch) -> str:
    """Why this job won its lane: its score terms, and who would have won without a deciding term."""
    how = f"loading {decision.model}" if decision.load else f"{decision.model} already loaded"
    if decision.load and decision.replaces:
        how = f"swapping {decision.replaces} for {decision.model}"
    text = f"dispatched to lane {decision.lane} ({how}) with score {format_score(decision.score)}"
    if decision.changed_by:
        parts = [f"{TERM_NAMES.get(term, term)} (else {job})" for term, job in sorted(decision.changed_by.items())]
        text += "; won because of " + ", ".join(parts)
    return text
