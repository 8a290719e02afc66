"""Residency policies written in Python, driven by the library's replay."""

import os
from collections import OrderedDict

import numpy as np
import pytest

import moe_residency as mr


class PyLRU:
    """The whole of an LRU, as docs/python.md shows it."""
    name = "py-lru"

    def __init__(self):
        self.order = OrderedDict()   # slot -> None, least recent first

    def on_hit(self, slot):
        self.order.move_to_end(slot)

    on_repeat = on_hit

    def on_insert(self, slot):
        self.order[slot] = None

    def on_evict(self, slot):
        del self.order[slot]

    def victim(self, view, layer):
        for slot in self.order:
            if view.evictable(slot):
                return slot
        return None


@pytest.fixture(scope="module")
def traces(traces_dir):
    return {n: mr.read_trace(os.path.join(traces_dir, n + ".route.csv")) for n in ("qwen", "gptoss")}


@pytest.mark.parametrize("name", ["qwen", "gptoss"])
def test_python_lru_equals_the_builtin_hit_for_hit(traces, name):
    budgets = [500, 1000, 1500, 2000, 3000, 4000, 8000]
    r = mr.replay(traces[name], budgets=budgets, policies=["lru", PyLRU])
    assert list(r.policy[:2]) == ["lru", "py-lru"]
    for col in ("lookups", "hits", "decode_lookups", "decode_hits", "evictions", "read_mib", "peak_resident_mib"):
        v = getattr(r, col)
        assert np.array_equal(v[0::2], v[1::2]), col
    assert r.hits[0::2].sum() > 0 and r.evictions[0::2].sum() > 0  # the comparison is not vacuous


class CheckingFIFO:
    """Evicts in insertion order and checks every hook against what it was told before."""
    name = "checking-fifo"

    def __init__(self):
        self.resident = OrderedDict()
        self.batches = self.victims = self.used = 0
        self.shape = None

    def init(self, shape, budget_bytes):
        self.shape, self.budget = shape, budget_bytes

    def on_batch_begin(self, phase, layer):
        assert phase in ("prefill", "decode") and 0 <= layer < self.shape.n_layers
        self.layer = layer
        self.batches += 1
        self.touched = set()

    def on_hit(self, slot):
        assert slot in self.resident and slot // self.shape.n_experts == self.layer
        self.touched.add(slot)

    def on_insert(self, slot):
        assert slot not in self.resident and slot // self.shape.n_experts == self.layer
        self.resident[slot] = None
        self.used += int(self.shape.expert_bytes[self.layer])
        self.touched.add(slot)

    def on_evict(self, slot):
        assert slot in self.resident
        del self.resident[slot]
        self.used -= int(self.shape.expert_bytes[slot // self.shape.n_experts])

    def victim(self, view, layer):
        assert view.used_bytes == self.used and view.budget_bytes == self.budget and self.used > self.budget
        self.victims += 1
        if self.victims % 101 == 1:  # every slot's state now and then (each check is a call)
            for s in self.resident:
                assert view.resident(s) and view.bytes_of(s) == self.shape.expert_bytes[view.layer_of(s)]
                assert view.evictable(s) == (s not in self.touched)
        for s in self.resident:
            if view.evictable(s):
                return s
        return None

    def on_batch_end(self, layer):
        assert layer == self.layer


def test_hooks_see_a_consistent_cache(traces):
    made = []

    def factory():
        made.append(CheckingFIFO())
        return made[-1]
    r = mr.replay(traces["qwen"], budgets=[1000, 4000], policies=[factory])
    assert len(made) == 2 and all(p.batches > 0 and p.victims > 0 for p in made)
    assert r.policy == ["factory", "factory"] and np.all(r.evictions > 0)


def test_errors_in_a_python_policy(traces):
    t = traces["gptoss"]

    class Raises(PyLRU):
        def on_hit(self, slot):
            raise ZeroDivisionError("from on_hit")
    with pytest.raises(ZeroDivisionError, match="from on_hit"):
        mr.replay(t, budgets=[2000], policies=[Raises])

    class NotEvictable(PyLRU):
        def victim(self, view, layer):
            return next(iter(self.order.keys().__reversed__()))   # the one just inserted
    with pytest.raises(ValueError, match="victim\\(\\) returned slot .* expected a slot with view.evictable"):
        mr.replay(t, budgets=[2000], policies=[NotEvictable])

    class OutOfRange(PyLRU):
        def victim(self, view, layer):
            return 10 ** 9
    with pytest.raises(ValueError, match="slot 1000000000 out of range"):
        mr.replay(t, budgets=[2000], policies=[OutOfRange])

    class BoolSlot(PyLRU):
        def victim(self, view, layer):
            return True
    with pytest.raises(TypeError, match="victim\\(\\) returned a bool; expected a slot"):
        mr.replay(t, budgets=[2000], policies=[BoolSlot])

    class HugeSlot(PyLRU):
        def victim(self, view, layer):
            return 2 ** 70
    with pytest.raises(ValueError, match="victim\\(\\) returned 1180591620717411303424, out of range"):
        mr.replay(t, budgets=[2000], policies=[HugeSlot])

    class WrongType(PyLRU):
        def victim(self, view, layer):
            return "the oldest"
    with pytest.raises(TypeError, match="victim\\(\\) returned a str; expected a slot"):
        mr.replay(t, budgets=[2000], policies=[WrongType])

    class NoVictim:
        pass
    with pytest.raises(TypeError, match="no victim\\(view, layer\\) method"):
        mr.replay(t, budgets=[2000], policies=[NoVictim])

    kept = []

    class KeepsTheView(PyLRU):
        def victim(self, view, layer):
            kept.append(view)
            return super().victim(view, layer)
    mr.replay(t, budgets=[2000], policies=[KeepsTheView])
    with pytest.raises(ValueError, match="used after victim\\(\\) returned"):
        kept[0].evictable(0)

    class BadInit(PyLRU):
        def init(self, shape, budget):
            raise RuntimeError("budget %d refused" % budget)
    with pytest.raises(RuntimeError, match="budget 2097152000 refused"):
        mr.replay(t, budgets=[2000], policies=[BadInit])

    with pytest.raises(TypeError, match=r"^policies\[1\]: 3 is an int; expected a policy name \(str\) or a class/factory that returns a policy object$"):
        mr.replay(t, budgets=[2000], policies=["lru", 3])
    with pytest.raises(TypeError, match="built-in policies only"):
        mr.replay(t, budgets=[2000], policies=[PyLRU], speculate="prev-token")


def test_numpy_slots_and_truth_values(traces):
    # victim() may return a numpy integer (argmin of an array of ages), over_budget() any truth value
    import numpy as np

    class NumpyLRU(PyLRU):
        name = "numpy-lru"

        def victim(self, view, layer):
            s = super().victim(view, layer)
            return None if s is None else np.int64(s)

        def over_budget(self, view, layer):
            return np.bool_(view.used_bytes > view.budget_bytes)
    r = mr.replay(traces["gptoss"], budgets=[1000, 3000], policies=["lru", NumpyLRU])
    assert np.array_equal(r.hits[0::2], r.hits[1::2]) and np.array_equal(r.evictions[0::2], r.evictions[1::2])


def test_a_policy_that_evicts_nothing_stays_over_budget(traces):
    class Never(PyLRU):
        def victim(self, view, layer):
            return None
    r = mr.replay(traces["gptoss"], budgets=[1000], policies=[Never])
    assert r.evictions[0] == 0 and r.peak_resident_mib[0] > 1000
