"""Derived facts of a pattern (`required_kinds`, `height`) are computed once per pattern
object: sub-patterns are shared, and a walk that repeats them grows exponentially."""
from braze.rewrite import P, V
from braze.rewrite.pattern import Alt, Pat


def _shared_tower(levels: int):
    """levels of add(p, p) | mul(p, p) over one shared leaf: 4**levels paths, 3 objects per
    level."""
    p = P.exp(V("x"))
    for _ in range(levels):
        p = P.add(p, p) | P.mul(p, p)
    return p


def test_required_kinds_and_height_walk_each_shared_pattern_once(monkeypatch):
    calls = []
    real = Pat._required_kinds
    monkeypatch.setattr(Pat, "_required_kinds", lambda self: calls.append(self) or real(self))
    tower = _shared_tower(12)
    assert isinstance(tower, Alt)
    kinds = tower.required_kinds()
    assert len(calls) == 1 + 2 * 12          # each Pat object once, not once per path
    assert ("exp",) in kinds
    assert tower.height() == 13
    tower.required_kinds()
    assert len(calls) == 1 + 2 * 12          # and a second call reads the memo


def test_memo_is_not_a_field():
    a = P.exp(V("x"))
    before = repr(a)
    a.required_kinds(), a.height()
    assert repr(a) == before                 # printing / fields unchanged by the memo
