"""The rewrite engine: declarative patterns, rules with reasoned checks, and a driver that
rebuilds graphs safely while recording match statistics and near misses."""
from .driver import RewriteContext, RewriteResult, RuleStats, rewrite, rewrite_once  # noqa: F401
from .miss import Miss, MissedFusion, MissReason, fail  # noqa: F401
from .pattern import Alt, Guarded, P, Pat, Pattern, Var  # noqa: F401
from .rule import Match, Rule  # noqa: F401

V = Var
