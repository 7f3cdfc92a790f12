"""Plain-language explanations of the dispatcher's decisions, for Events, logs and the CLI."""

from __future__ import annotations

from collections.abc import Callable

from gpulane.core.events import Dispatch
from gpulane.core.priority import band_of
from gpulane.core.score import ScoreBreakdown

# How each term is named when it changed the winner.
TERM_NAMES = {"aging": "aging", "affinity": "swap affinity", "fairShare": "fair share"}


def format_score(score: ScoreBreakdown) -> str:
    """``112.5 = priority 100 + tier 2 + affinity 10 + aging 0.5``."""
    return (
        f"{score.total:.1f} = priority {score.priority} + tier {score.tier} + affinity {score.affinity:g}"
        f" + aging {score.aging:.1f}"
    )


def describe_dispatch(decision: Dispatch, name: Callable[[str], str] = str) -> str:
    """Why this job won its lane: its score terms, and who would have won without a deciding term
    (each job id as ``name`` shows it: the operator hides other namespaces' jobs)."""
    how = f"loading {decision.model}" if decision.load else f"{decision.model} already loaded"
    if decision.load and decision.replaces:
        how = f"swapping {decision.replaces} for {decision.model}"
    text = f"dispatched to lane {decision.lane} ({how}) with score {format_score(decision.score)}"
    if decision.changed_by:
        parts = [
            f"{TERM_NAMES.get(term, term)} (else {name(job)})" for term, job in sorted(decision.changed_by.items())
        ]
        text += "; won because of " + ", ".join(parts)
    return text


# The terms that can put one job ahead of another, as a sentence ends: "... because of <reason>".
REASONS = {
    "band": "a higher priority band",
    "priority": "a higher priority inside the band",
    "tier": "a better tier",
    "affinity": "swap affinity (its model was loaded)",
    "aging": "aging (it had waited longer)",
    "fairShare": "fair share (the waiting job's member had used more GPU time lately, or been served more recently)",
    "arrival": "arrival order (equal scores)",
}


def deciding_term(winner: ScoreBreakdown, loser: ScoreBreakdown, band_spacing: int) -> str:
    """Which term put ``winner`` ahead of ``loser`` at the winner's dispatch (a key of REASONS).

    ``loser`` is scored as if its aging ran from its own submission; if it still scores at least as
    high, only the fair-share clock (or arrival order, on a tie) can have put the winner first.
    """
    if band_of(winner.priority, band_spacing) > band_of(loser.priority, band_spacing):
        return "band"  # (from a lower band, only aging can have lifted it: the terms below say so)
    diffs = {
        "priority": winner.priority - loser.priority,
        "tier": winner.tier - loser.tier,
        "affinity": winner.affinity - loser.affinity,
        "aging": winner.aging - loser.aging,
    }
    margin = winner.total - loser.total
    if margin < 0:
        return "fairShare"
    if margin == 0:
        return "arrival"
    # The term without which the winner would not have been ahead; the largest if several.
    decisive = [t for t, d in diffs.items() if d > 0 and d >= margin] or [t for t, d in diffs.items() if d > 0]
    return max(decisive, key=lambda t: diffs[t])
