"""The search space in Ray Tune's spelling, mapped onto Optuna's distributions.

``choice([...])``, ``uniform(a, b)``, ``loguniform(a, b)`` and ``randint(a, b)`` (``b`` left
out, as in Ray Tune and NumPy) each stand for one hyperparameter; any other value in the
space is a constant that every trial's config carries as it is. Optuna is imported only when
a space is turned into distributions, so ``train_fn`` modules and the trial workers that
import this package never need it.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Sequence, Tuple


class Domain:
    """One hyperparameter's range; ``distribution()`` is its Optuna counterpart."""

    def distribution(self) -> Any:
        raise NotImplementedError


def _number(value: Any, name: str, spelling: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise TypeError(f"tune.{spelling}: {name} must be a finite number, got {value!r}")
    return value


class Categorical(Domain):
    def __init__(self, categories: Sequence[Any]) -> None:
        if isinstance(categories, (str, bytes)) or not isinstance(categories, Sequence) \
                or len(categories) == 0:
            raise ValueError(f"tune.choice: categories must be a non-empty list, got "
                             f"{categories!r}")
        for value in categories:
            if value is not None and not isinstance(value, (bool, int, float, str)):
                raise TypeError(f"tune.choice: each category must be None, a bool, int, "
                                f"float or str (what Optuna stores), got {value!r}")
        self.categories = list(categories)

    def distribution(self) -> Any:
        from optuna.distributions import CategoricalDistribution
        return CategoricalDistribution(self.categories)

    def __repr__(self) -> str:
        return f"choice({self.categories!r})"


class Float(Domain):
    def __init__(self, low: float, high: float, log: bool) -> None:
        spelling = "loguniform" if log else "uniform"
        low, high = (_number(low, "lower", spelling), _number(high, "upper", spelling))
        if not low < high:
            raise ValueError(f"tune.{spelling}: lower must be below upper, got {low!r} and "
                             f"{high!r}")
        if log and low <= 0:
            raise ValueError(f"tune.loguniform: lower must be > 0, got {low!r}")
        self.low, self.high, self.log = float(low), float(high), log

    def distribution(self) -> Any:
        from optuna.distributions import FloatDistribution
        return FloatDistribution(self.low, self.high, log=self.log)

    def __repr__(self) -> str:
        return f"{'loguniform' if self.log else 'uniform'}({self.low!r}, {self.high!r})"


class Integer(Domain):
    """``randint(lower, upper)``: lower included, upper excluded."""

    def __init__(self, low: int, high: int) -> None:
        for name, value in (("lower", low), ("upper", high)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"tune.randint: {name} must be an int, got {value!r}")
        if not low < high:
            raise ValueError(f"tune.randint: lower must be below upper (excluded), got {low} "
                             f"and {high}")
        self.low, self.high = low, high

    def distribution(self) -> Any:
        from optuna.distributions import IntDistribution
        return IntDistribution(self.low, self.high - 1)

    def __repr__(self) -> str:
        return f"randint({self.low}, {self.high})"


def choice(categories: Sequence[Any]) -> Categorical:
    return Categorical(categories)


def uniform(lower: float, upper: float) -> Float:
    return Float(lower, upper, log=False)


def loguniform(lower: float, upper: float) -> Float:
    return Float(lower, upper, log=True)


def randint(lower: int, upper: int) -> Integer:
    return Integer(lower, upper)


def split_space(space: Mapping[str, Any]) -> Tuple[Dict[str, Domain], Dict[str, Any]]:
    """(the hyperparameters to search, the constants); ValueError for what cannot be one."""
    if not isinstance(space, Mapping) or not space:
        raise ValueError(f"DistributedTuner: search_space must be a non-empty dict of name -> "
                         f"tune.choice/uniform/loguniform/randint or constant, got {space!r}")
    searched, constants = {}, {}
    for name, value in space.items():
        if not isinstance(name, str):
            raise TypeError(f"DistributedTuner: search_space keys must be str, got {name!r}")
        if isinstance(value, Domain):
            searched[name] = value
        elif isinstance(value, Mapping) and any(isinstance(v, Domain) for v in value.values()):
            raise ValueError(f"DistributedTuner: search_space[{name!r}] nests hyperparameters "
                             f"in a dict; give them flat names (e.g. '{name}_lr')")
        else:
            constants[name] = value
    if not searched:
        raise ValueError(f"DistributedTuner: search_space has no hyperparameter to search "
                         f"(tune.choice/uniform/loguniform/randint), only constants "
                         f"{sorted(constants)}")
    return searched, constants
