"""The inputs of a policy as solver variables, and its conditions as formulas over them.

A context value is a tagged union, as the engine sees it (orchestrator/engine/conditions.py):
absent (missing or null), a number, a string, a boolean, or something else (a list, an object).
Each condition operator is encoded with the engine's rules: a missing field makes positive
operators false and negative ones true; ``equals`` treats 5, 5.0 and "5" alike; ``in``/``not_in``
match IPv4 addresses against CIDR ranges; ``regex_match`` searches with RE2, translated into the
solver's regular expressions for the decidable subset (literals, classes, ``.``, groups,
alternation, repetition, ``^``/``$`` at the ends). What is not modelled is a free variable (a
``Free`` note says which), so a proof stays a proof: the solver may only find counterexamples the
engine then has to reproduce.
"""

from __future__ import annotations

import ipaddress
import math
import re._parser as sre_parse  # the standard library's regex parser (RE2's syntax is a subset)
from dataclasses import dataclass, field
from typing import Any

import z3

from crossaudit.kernel.dsl import Condition, Operator

NEGATIVE = {Operator.NOT_EQUALS, Operator.NOT_IN, Operator.NOT_CONTAINS}
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
ALWAYS_PRESENT = {"time.hour", "time.minute", "time.day_of_week", "time.date", "time.iso", "time.timestamp",
                  "time.timezone", "content.length", "content.hash"}  # fmt: skip
INTEGER_FIELDS = {"time.hour": (0, 23), "time.minute": (0, 59), "content.length": (0, None)}
MAX_REPEAT = 1000  # a larger bounded repetition is left free


@dataclass
class Val:
    """One value a condition may read. ``text`` is what ``str(value)`` gives for each kind."""

    name: str
    present: z3.BoolRef
    isnum: z3.BoolRef
    num: z3.ArithRef
    isstr: z3.BoolRef
    text: z3.SeqRef
    isbool: z3.BoolRef
    boolean: z3.BoolRef
    isother: z3.BoolRef
    num_text: z3.SeqRef  # str() of the number (free unless the field is integral)
    strisnum: z3.BoolRef  # a string that float() reads (the engine compares it as a number)
    strnum: z3.ArithRef
    isip: z3.BoolRef = field(default_factory=lambda: z3.BoolVal(False))
    ip: z3.BitVecRef | None = None


def _fresh_val(name: str) -> tuple[Val, list[z3.BoolRef]]:
    """A free context value ``name`` and the constraints that make it one value of one kind."""
    p = f"ctx[{name}]"
    v = Val(
        name=name,
        present=z3.Bool(f"{p}.present"),
        isnum=z3.Bool(f"{p}.isnum"),
        num=z3.Real(f"{p}.num"),
        isstr=z3.Bool(f"{p}.isstr"),
        text=z3.String(f"{p}.text"),
        isbool=z3.Bool(f"{p}.isbool"),
        boolean=z3.Bool(f"{p}.bool"),
        isother=z3.Bool(f"{p}.isother"),
        num_text=z3.String(f"{p}.numtext"),
        strisnum=z3.Bool(f"{p}.strisnum"),
        strnum=z3.Real(f"{p}.strnum"),
        isip=z3.Bool(f"{p}.isip"),
        ip=z3.BitVec(f"{p}.ip4", 32),
    )
    kinds = [v.isnum, v.isstr, v.isbool, v.isother]
    domain = [
        z3.If(v.present, z3.PbEq([(k, 1) for k in kinds], 1), z3.And(*[z3.Not(k) for k in kinds])),
        z3.Implies(v.isip, v.isstr),
        z3.Implies(z3.Not(v.isstr), z3.Not(v.strisnum)),
    ]
    return v, domain


def constant_val(name: str, value: Any, present: z3.BoolRef | bool = True) -> Val:
    """A value the policy's own results give (``previous_rule``): its kind known, ``value`` a
    z3 term (Real, Bool or String)."""
    f, t = z3.BoolVal(False), z3.BoolVal(True)
    pres = z3.BoolVal(present) if isinstance(present, bool) else present
    isnum = isinstance(value, z3.ArithRef)
    isbool = isinstance(value, z3.BoolRef)
    isstr = isinstance(value, z3.SeqRef)
    return Val(
        name=name,
        present=pres,
        isnum=z3.And(pres, t) if isnum else f,
        num=value if isnum else z3.RealVal(0),
        isstr=z3.And(pres, t) if isstr else f,
        text=value if isstr else z3.StringVal(""),
        isbool=z3.And(pres, t) if isbool else f,
        boolean=value if isbool else f,
        isother=f,
        num_text=z3.String(f"{name}.numtext"),
        strisnum=f,
        strnum=z3.RealVal(0),
    )


class World:
    """The variables of the inputs: shared by every rule, and by both policies of a diff."""

    def __init__(self) -> None:
        self.stage = z3.Int("stage")  # 0: no stage named, 1: input, 2: output
        self.evaluators: dict[str, tuple[z3.BoolRef, z3.ArithRef, z3.BoolRef, z3.BoolRef]] = {}
        self.fields: dict[str, Val] = {}
        self.details: dict[tuple[tuple[str, ...], str], Val] = {}
        self.frees: dict[str, z3.BoolRef] = {}
        self.free_notes: dict[str, str] = {}
        self.domain: list[z3.BoolRef] = [self.stage >= 0, self.stage <= 2]
        self.tidy: list[z3.BoolRef] = []  # what a witness should prefer (module docstring of solve)
        self.margins: list[tuple[z3.ArithRef, z3.ArithRef]] = []  # computed comparisons: keep off the edge
        self.texted: set[str] = set()  # fields whose number's text a condition reads
        self.ip_read: set[str] = set()  # fields compared with addresses or ranges

    # -- evaluators -------------------------------------------------------------------------

    def evaluator(self, name: str) -> tuple[z3.BoolRef, z3.ArithRef, z3.BoolRef, z3.BoolRef]:
        """(gave a verdict, score, said ``passed: false``, timed out) of evaluator ``name``."""
        hit = self.evaluators.get(name)
        if hit is None:
            ok, s = z3.Bool(f"eval[{name}].verdict"), z3.Real(f"eval[{name}].score")
            pf, to = z3.Bool(f"eval[{name}].passed_false"), z3.Bool(f"eval[{name}].timeout")
            self.domain += [s >= 0, s <= 1, z3.Implies(ok, z3.Not(to))]
            self.tidy += [z3.Not(pf), ok]
            hit = self.evaluators[name] = (ok, s, pf, to)
        return hit

    # -- context ----------------------------------------------------------------------------

    def field(self, path: str) -> Val:
        hit = self.fields.get(path)
        if hit is not None:
            return hit
        v, domain = _fresh_val(path)
        self.fields[path] = v
        self.domain += domain
        self.domain += _derived_domain(path, v)
        self.tidy += [z3.Not(v.isother), z3.Not(v.strisnum)]
        for parent in _parents(path):  # a value at user.role means user is an object
            if parent in self.fields:
                self.domain.append(z3.Implies(v.present, self.fields[parent].isother))
        for child, cv in self.fields.items():
            if path in _parents(child):
                self.domain.append(z3.Implies(cv.present, v.isother))
        return v

    def detail(self, evaluators: tuple[str, ...], key: str, gate: z3.BoolRef) -> Val:
        """``previous_rule.<rule>.<key>`` for a key of the details the rule's evaluators give: free
        (their code decides), present only when ``gate`` (one of them answered)."""
        hit = self.details.get((evaluators, key))
        if hit is None:
            v, domain = _fresh_val(f"details[{'+'.join(evaluators)}].{key}")
            self.domain += domain
            self.tidy += [z3.Not(v.isother), z3.Not(v.strisnum), z3.Not(v.isip)]
            hit = self.details[(evaluators, key)] = v
            self.note(f"details:{key}", f"the evaluator detail {key!r} is a free value (its code decides it)")
        gated = Val(**{**hit.__dict__, "present": z3.And(hit.present, gate)})
        return gated

    def free(self, key: str, why: str) -> z3.BoolRef:
        """A free truth value for what is not modelled (one per ``key``: the same question, one answer)."""
        hit = self.frees.get(key)
        if hit is None:
            hit = self.frees[key] = z3.Bool(f"free[{key}]")
            self.note(key, why)
        return hit

    def note(self, key: str, why: str) -> None:
        self.free_notes.setdefault(key, why)


def _parents(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


_DIGIT = z3.Range("0", "9")
_DOTTED = z3.Plus(z3.Union(_DIGIT, z3.Re(".")))
_HEX = z3.Union(_DIGIT, z3.Range("a", "f"))


def _derived_domain(path: str, v: Val) -> list[z3.BoolRef]:
    """What the engine derives (orchestrator/engine/context.py): time.* and content.length/hash
    are always there, of the engine's types. A caller pinning them to other values is not modelled."""
    out: list[z3.BoolRef] = []
    if path in ALWAYS_PRESENT:
        out.append(v.present)
    if path in INTEGER_FIELDS:
        lo, hi = INTEGER_FIELDS[path]
        out += [v.isnum, z3.IsInt(v.num), v.num >= lo]
        if hi is not None:
            out.append(v.num <= hi)
    elif path == "time.day_of_week":
        out += [v.isstr, z3.Or(*[v.text == z3.StringVal(d) for d in DAYS]), z3.Not(v.strisnum)]
    elif path == "content.hash":
        out += [v.isstr, z3.InRe(v.text, z3.Loop(_HEX, 64, 64)), z3.Not(v.isip)]
    elif path in ("time.date", "time.iso", "time.timezone"):
        out += [v.isstr, z3.Not(v.isip)]
    elif path == "time.timestamp":
        out += [v.isnum]
    return out


# --- conditions ------------------------------------------------------------------------------


def _num(x: Any) -> float | None:
    """The engine's ``_num`` of a policy's literal."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int | float):
        try:
            return float(x)
        except OverflowError:
            return math.inf if x > 0 else -math.inf
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return None


def real(x: float) -> z3.ArithRef:
    """The exact value of a float (its decimal repr: what the engine's literal is)."""
    return z3.RealVal(repr(float(x)))


def _is_finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


class Encoder:
    """Conditions as formulas over a :class:`World`'s values."""

    def __init__(self, world: World) -> None:
        self.w = world

    def _number_text(self, v: Val) -> z3.SeqRef:
        """``str()`` of a number: exact for a whole number from 0 (its digits), free otherwise (a
        witness prefers a string there). Added only where a text operator reads the value: string
        constraints are the costly part of a query."""
        if v.name not in self.w.texted:
            self.w.texted.add(v.name)
            whole = z3.And(z3.IsInt(v.num), v.num >= 0)
            self.w.domain.append(z3.Implies(whole, v.num_text == z3.IntToStr(z3.ToInt(v.num))))
            if v.name not in INTEGER_FIELDS:
                self.w.tidy.append(z3.Not(v.isnum))
        return v.num_text

    def check(self, cond: Condition, v: Val) -> z3.BoolRef:
        positive = self._positive(cond, v)
        op = cond.operator
        if op in NEGATIVE:
            return z3.Or(z3.Not(v.present), z3.Not(positive))
        return z3.And(v.present, positive)

    def _positive(self, cond: Condition, v: Val) -> z3.BoolRef:
        """The positive operator's truth for a present value (negatives are its negation)."""
        op, target = cond.operator, cond.value
        if op in (Operator.EQUALS, Operator.NOT_EQUALS):
            return self.equal(v, target, f"{v.name} equals {target!r}")
        if op in (Operator.CONTAINS, Operator.NOT_CONTAINS):
            return self._contains(v, target)
        if op in (Operator.IN, Operator.NOT_IN):
            return self._member(v, list(target))
        if op in (Operator.GREATER_THAN, Operator.LESS_THAN):
            b = _num(target)
            if not _is_finite(b):
                return self.w.free(f"{v.name} {op.value} {target!r}", "a comparison with a non-finite number")
            rb = real(b)  # type: ignore[arg-type]
            if op is Operator.GREATER_THAN:
                return z3.Or(z3.And(v.isnum, v.num > rb), z3.And(v.strisnum, v.strnum > rb))
            return z3.Or(z3.And(v.isnum, v.num < rb), z3.And(v.strisnum, v.strnum < rb))
        return self._text_op(v, op, str(target))

    def equal(self, v: Val, target: Any, key: str) -> z3.BoolRef:
        if isinstance(target, bool):
            return z3.And(v.isbool, v.boolean == z3.BoolVal(target))
        if isinstance(target, int | float):
            b = _num(target)
            if not _is_finite(b):
                return self.w.free(key, "equality with a non-finite number")
            rb = real(b)  # type: ignore[arg-type]
            return z3.Or(z3.And(v.isnum, v.num == rb), z3.And(v.strisnum, v.strnum == rb))
        if isinstance(target, str):
            out = z3.And(v.isstr, v.text == z3.StringVal(target))
            b = _num(target)
            if _is_finite(b):
                out = z3.Or(out, z3.And(v.isnum, v.num == real(b)))  # type: ignore[arg-type]
            return out
        if target is None:
            return z3.BoolVal(False)
        return z3.And(v.isother, self.w.free(key, "equality of a list or an object"))

    def _contains(self, v: Val, needle: Any) -> z3.BoolRef:
        n = z3.StringVal(str(needle))
        other = z3.And(v.isother, self.w.free(f"{v.name} contains {needle!r}", "contains on a list or an object"))
        return z3.Or(
            z3.And(v.isstr, z3.Contains(v.text, n)),
            z3.And(v.isnum, z3.Contains(self._number_text(v), n)),
            z3.And(v.isbool, z3.Contains(z3.If(v.boolean, z3.StringVal("True"), z3.StringVal("False")), n)),
            other,
        )

    def _text_op(self, v: Val, op: Operator, pattern: str) -> z3.BoolRef:
        p = z3.StringVal(pattern)
        if op is Operator.REGEX_MATCH:
            rx = regex(pattern)
            if rx is None:
                f = self.w.free(f"{v.name} regex_match {pattern!r}", f"regex {pattern!r} is beyond the modelled subset")

                def holds(t: z3.SeqRef) -> z3.BoolRef:
                    return f
            else:

                def holds(t: z3.SeqRef) -> z3.BoolRef:
                    return z3.InRe(t, rx)
        elif op is Operator.STARTS_WITH:

            def holds(t: z3.SeqRef) -> z3.BoolRef:
                return z3.PrefixOf(p, t)
        else:

            def holds(t: z3.SeqRef) -> z3.BoolRef:
                return z3.SuffixOf(p, t)

        other = z3.And(v.isother, self.w.free(f"{v.name} {op.value} {pattern!r}", f"{op.value} on a list or object"))
        return z3.Or(
            z3.And(v.isstr, holds(v.text)),
            z3.And(v.isnum, holds(self._number_text(v))),
            z3.And(v.isbool, z3.If(v.boolean, holds(z3.StringVal("True")), holds(z3.StringVal("False")))),
            other,
        )

    def _member(self, v: Val, options: list[Any]) -> z3.BoolRef:
        parts = []
        for opt in options:
            if isinstance(opt, str) and "/" in opt:
                parts.append(self._in_network(v, opt))
            elif isinstance(opt, str):
                try:
                    addr = ipaddress.ip_address(opt.strip())
                except ValueError:
                    addr = None
                if isinstance(addr, ipaddress.IPv4Address) and v.ip is not None:
                    self._ip_text(v)
                    parts.append(z3.And(v.isip, v.ip == z3.BitVecVal(int(addr), 32)))
                elif addr is not None:
                    parts.append(self.w.free(f"{v.name} is {opt}", "IPv6 addresses are not modelled"))
            parts.append(self.equal(v, opt, f"{v.name} equals {opt!r}"))
        return z3.Or(*parts) if parts else z3.BoolVal(False)

    def _ip_text(self, v: Val) -> None:
        """A witness's value that is not an address should not read as one (the engine would)."""
        if v.name not in self.w.ip_read:
            self.w.ip_read.add(v.name)
            self.w.tidy.append(z3.Implies(z3.Not(v.isip), z3.Not(z3.InRe(v.text, _DOTTED))))

    def _in_network(self, v: Val, opt: str) -> z3.BoolRef:
        try:
            net = ipaddress.ip_network(opt, strict=False)
        except ValueError:
            return z3.BoolVal(False)  # the engine skips an invalid range (validation refuses one)
        if isinstance(net, ipaddress.IPv6Network) or v.ip is None:
            return self.w.free(f"{v.name} in {opt}", "IPv6 ranges are not modelled")
        self._ip_text(v)
        mask = z3.BitVecVal(int(net.netmask), 32)
        return z3.And(v.isip, (v.ip & mask) == z3.BitVecVal(int(net.network_address), 32))


# --- RE2 patterns as solver regular expressions -------------------------------------------------

_ALL = z3.AllChar(z3.ReSort(z3.StringSort()))
_NOT_NEWLINE = z3.Intersect(_ALL, z3.Complement(z3.Re("\n")))
_CATEGORIES = {
    sre_parse.CATEGORY_DIGIT: _DIGIT,
    sre_parse.CATEGORY_WORD: z3.Union(_DIGIT, z3.Range("a", "z"), z3.Range("A", "Z"), z3.Re("_")),
    sre_parse.CATEGORY_SPACE: z3.Union(*[z3.Re(c) for c in "\t\n\f\r "]),
}


class _Unsupported(Exception):
    pass


def regex(pattern: str) -> z3.ReRef | None:
    """``search(pattern, text)`` as ``InRe(text, result)``; None beyond the modelled subset."""
    try:
        parsed = list(sre_parse.parse(pattern))
        anchored_start = bool(parsed) and parsed[0] == (sre_parse.AT, sre_parse.AT_BEGINNING)
        anchored_end = bool(parsed) and parsed[-1][0] is sre_parse.AT and parsed[-1][1] in (
            sre_parse.AT_END, sre_parse.AT_END_STRING)  # fmt: skip
        body = parsed[int(anchored_start) : len(parsed) - int(anchored_end)]
        core = _seq(body)
    except (_Unsupported, Exception):
        return None
    parts = ([] if anchored_start else [z3.Star(_ALL)]) + [core] + ([] if anchored_end else [z3.Star(_ALL)])
    return z3.Concat(*parts) if len(parts) > 1 else parts[0]


def _seq(items: list[Any]) -> z3.ReRef:
    res = [_item(op, av) for op, av in items]
    if not res:
        return z3.Re("")
    return z3.Concat(*res) if len(res) > 1 else res[0]


def _item(op: Any, av: Any) -> z3.ReRef:
    if op is sre_parse.LITERAL:
        return z3.Re(chr(av))
    if op is sre_parse.NOT_LITERAL:
        return z3.Intersect(_ALL, z3.Complement(z3.Re(chr(av))))
    if op is sre_parse.ANY:
        return _NOT_NEWLINE
    if op is sre_parse.IN:
        return _class(av)
    if op is sre_parse.BRANCH:
        return z3.Union(*[_seq(list(b)) for b in av[1]])
    if op is sre_parse.SUBPATTERN:
        _group, add_flags, del_flags, sub = av
        if add_flags or del_flags:
            raise _Unsupported
        return _seq(list(sub))
    if op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT):
        lo, hi, sub = av
        inner = _seq(list(sub))
        if hi is sre_parse.MAXREPEAT:
            if lo > MAX_REPEAT:
                raise _Unsupported
            return z3.Concat(z3.Loop(inner, lo, lo), z3.Star(inner)) if lo else z3.Star(inner)
        if hi > MAX_REPEAT:
            raise _Unsupported
        return z3.Loop(inner, lo, hi)
    raise _Unsupported  # anchors inside, backreferences, look-around, flags


def _class(items: list[Any]) -> z3.ReRef:
    negate = False
    parts = []
    for op, av in items:
        if op is sre_parse.NEGATE:
            negate = True
        elif op is sre_parse.LITERAL:
            parts.append(z3.Re(chr(av)))
        elif op is sre_parse.RANGE:
            parts.append(z3.Range(chr(av[0]), chr(av[1])))
        elif op is sre_parse.CATEGORY and av in _CATEGORIES:
            parts.append(_CATEGORIES[av])
        else:
            raise _Unsupported
    union = z3.Union(*parts) if len(parts) > 1 else parts[0]
    return z3.Intersect(_ALL, z3.Complement(union)) if negate else union
