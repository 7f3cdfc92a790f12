"""Under fair share by usage, each band's teams ranked by the pick each would make, kept as the queue changes.

A band's pick is the team that used the least for its weight, then its member that used the least. Scanning every
team at each decision made a decision cost the number of members (7.5 ms at 500 members, each a team of one, for
about 50 us in the brief). Instead each team's pick, ranked among the band's teams, and its best job of each model
(what affinity weighs), sit in two ranked indexes. An event touches a few teams (a dispatch, a submission that heads a
queue, a usage correction) and only those are re-ranked, at the next decision. Whenever a team's entry can have
moved, the ranking marks it with ``touch``; the order is then exactly what a scan of every team would give.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gpulane.core.jobs import Job
from gpulane.core.ranked import RankedIndex, index_in

Best = tuple[float, int, Job]  # (value, seq, job): what a ranking picks
# A team's best head (by its member's key) ranked among the band's teams: the same head with the team's clock.
InTree = Callable[[Best, int], Best]


class TeamTops:
    def __init__(self) -> None:
        self._tops: dict[int, RankedIndex[Job]] = {}  # band -> team key -> the team's pick
        self._by_model: dict[int, RankedIndex[Job]] = {}  # band -> (team key, model) -> its best job of the model
        self._listed: dict[tuple[int, str], set[str]] = {}  # (band, team key) -> its models in _by_model
        self._stale: set[tuple[int, str]] = set()

    def touch(self, band: int, team: str) -> None:
        """The team's heads, or the clocks they are ranked by, may have changed in ``band``."""
        self._stale.add((band, team))

    def touch_all(self, bands: Mapping[int, Iterable[str]]) -> None:
        self._stale.update((band, team) for band, teams in bands.items() for team in teams)

    def heads(self, band: int, models: Iterable[str]) -> tuple[Best | None, dict[str, Best]]:
        """The band's pick among its teams, and for each of ``models`` the best of the teams' jobs of it (as of
        the last ``refresh``)."""
        tops, by_model = self._tops.get(band), self._by_model.get(band)
        if tops is None or by_model is None:
            return None, {}
        local = {model: best for model in models if (best := by_model.best_of(model)) is not None}
        return tops.best({}), local

    def copy(self) -> TeamTops:
        clone = TeamTops()
        clone._tops = {band: index.copy() for band, index in self._tops.items()}
        clone._by_model = {band: index.copy() for band, index in self._by_model.items()}
        clone._listed = {key: set(models) for key, models in self._listed.items()}
        clone._stale = set(self._stale)
        return clone

    def refresh(self, bands: Mapping[int, Mapping[str, RankedIndex[Job]]], in_tree: InTree) -> None:
        """Re-rank the teams touched since the last call (``bands``: each band's team indexes by member key)."""
        if not self._stale:
            return
        for band, team in self._stale:
            tops = index_in(self._tops, band)
            by_model = index_in(self._by_model, band)
            was = self._listed.pop((band, team), set())
            index = bands.get(band, {}).get(team)
            head = None if index is None else index.best({})
            if index is None or head is None:
                tops.discard(team)
                for model in was:
                    by_model.discard((team, model))
                continue
            value, seq, job = in_tree(head, band)
            tops.put(team, job.model, value, seq, job)
            listed = set()
            for model in index.models():
                mine = index.best_of(model)
                if mine is not None:
                    value, seq, job = in_tree(mine, band)
                    by_model.put((team, model), model, value, seq, job)
                    listed.add(model)
            for model in was - listed:
                by_model.discard((team, model))
            self._listed[(band, team)] = listed
        self._stale.clear()
