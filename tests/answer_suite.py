"""One suite for every lab's answers: the checks every lab's grading must pass, written once.

A lab's answers module (``tests/wrong_answers/labNN.py``) holds four tables, each keyed by
the lab's exercise names (``lab07.EXERCISES``' keys):

- ``CORRECT``       ``{key: [answer, ...]}``: right answers written differently from the
                    notebook's solution; they pass the visible and the hidden cases.
- ``WRONG``         ``{key: [(answer, words), ...]}``: answers students really write; they fail
                    the visible cases with a message containing ``words`` (a string, a
                    tuple of strings that must all appear, or ``wrong_answers.Says``, which
                    also names words that must not appear: another mistake's hint).
- ``WRONG_HIDDEN``  ``{key: [(answer, words), ...]}``: wrong answers that the visible cases
                    cannot tell from right ones; they pass the visible cases and fail the
                    hidden ones with ``words``.
- ``ALONE``         ``{key: [(answer, words), ...]}``: wrong answers that hang or crash some
                    ranks, graded one at a time through the exercise's public check (with
                    ``alone_timeout``), so that they stop no other answer's launch.

A lab's test module subclasses ``AnswerSuite`` and names its exercises and its answers::

    class TestAnswers(AnswerSuite):
        exercises = lab07.EXERCISES
        answers = wrong_answers.lab07

and adds only what is particular to the lab.  The visible cases of every answer but the
``ALONE`` ones are graded in one ``harness.grade_batch`` call (one launch per world size),
the hidden cases of ``CORRECT`` and ``WRONG_HIDDEN`` (``hidden_tables``) in another.  ``extra_visible`` adds
exercises of the lab's own (a variant graded on more ranks) to the visible batch.

One exercise at a time: every generic test's parameters start with its exercise's name and
a dash (``test_wrong_answer_fails_visible_naming_its_mistake[broadcast-broadcast_forgotten]``,
``test_every_stated_rule_is_broken_by_some_wrong_answer[broadcast-rules]``), and the two
batches grade only the answers the selected tests read: ``pytest tests/ranks/test_lab02.py -k
"[broadcast-"`` grades that exercise's answers alone.  (``-k`` matches substrings, so a plain
``-k broadcast`` also selects any test whose name holds the word, here lab 02's
``train_without_broadcast``, which costs one more Llama run.)  A lab's own test that reads a
batch names what it reads as parameters, ``key`` and, for one answer, ``answer`` (a name):
``@pytest.mark.parametrize("key,answer", [("ddp", "ddp_device_ids_zero")])``, so it too is
selected by its exercise; one that names neither gets the whole lab graded.
"""
from __future__ import annotations

from types import ModuleType

import pytest

from grading_reports import short_keys
from parlab.grading import harness
from wrong_answers import holds, must

TABLES = ("CORRECT", "WRONG", "WRONG_HIDDEN", "ALONE")


def _name(answer) -> str:
    return answer.__name__


def _says(message: str, words) -> bool:
    """The message names the answer's mistake (``words``) and no other (``Says.never``)."""
    return holds(message, words)


class AnswerSuite:
    exercises: dict = {}           # key -> harness.Exercise
    answers: ModuleType            # the lab's tests/wrong_answers module
    alone_timeout: float = 30.0    # seconds for each ALONE answer's launch
    batch_timeout: float | None = None  # seconds for each batch launch; None: the exercises' own
    hidden_tables: tuple = ("CORRECT", "WRONG_HIDDEN")  # graded on the hidden cases

    # ------------------------------------------------------------ the tables
    def table(self, name: str) -> dict:
        return getattr(self.answers, name, {})

    def extra_visible(self) -> dict:
        """``{Exercise: {name: answer}}`` added to the visible batch; none by default."""
        return {}

    def breaks(self, rule, message: str) -> bool:
        """Whether ``message`` (a wrong answer's) is the one that states ``rule``."""
        return rule.says in message

    def pytest_generate_tests(self, metafunc):
        """Each generic test runs once per row of the table it names (its ``rows``), or once per
        exercise (its ``each_exercise``: which exercises, and the word after the name in the id),
        with the exercise's name and a dash first in its id."""
        each = getattr(metafunc.function, "each_exercise", None)
        if each is not None:
            which, word = each
            keys = [key for key, ex in self.exercises.items() if which(ex)]
            metafunc.parametrize("key", keys or [pytest.param(None, marks=pytest.mark.no_rows)],
                                 ids=lambda key: f"{key}-{word}")
            return
        table = getattr(metafunc.function, "rows", None)
        if table is None:
            return
        found = self.table(table)
        if table == "CORRECT":
            rows = [(key, a, None) for key, answers in found.items() for a in answers]
        else:
            rows = [(key, a, words) for key, pairs in found.items() for a, words in pairs]
        if not rows:  # the lab has no such answers: the test is deselected (tests/conftest.py)
            metafunc.parametrize("key,answer,words", [pytest.param(None, None, None, marks=pytest.mark.no_rows)])
            return
        metafunc.parametrize("key,answer,words", rows, ids=[f"{k}-{_name(a)}" for k, a, _ in rows])

    # ------------------------------------------------------------ the two batches
    #: What the selected tests read, set by the fixtures: None (everything), or a set of
    #: ``(key, answer name)`` and ``(key, None)`` (all of that exercise's answers).
    wanted: set | None = None

    def wants(self, key: str, name: str | None = None) -> bool:
        """Whether the selected tests read exercise ``key``'s answer ``name`` (all of them: None)."""
        return (self.wanted is None or (key, None) in self.wanted
                or name is not None and (key, name) in self.wanted)

    def _batch(self, tables: tuple[str, ...]) -> dict:
        batch: dict = {}
        for table in tables:
            for key, rows in self.table(table).items():
                answers = rows if table == "CORRECT" else [a for a, _ in rows]
                chosen = {_name(a): a for a in answers if self.wants(key, _name(a))}
                if chosen:
                    batch.setdefault(self.exercises[key], {}).update(chosen)
        return batch

    @classmethod
    def _suite_for(cls, request, fixture: str) -> "AnswerSuite":
        """An instance whose ``wanted`` holds what the selected tests of this class that use
        ``fixture`` read (``request.session.items`` is the selection, after ``-k``)."""
        suite, wanted = cls(), set()
        for item in request.session.items:
            if getattr(item, "cls", None) is not request.cls or fixture not in getattr(item, "fixturenames", ()):
                continue
            params = getattr(getattr(item, "callspec", None), "params", {})
            if params.get("key") is None:
                return suite  # a test that names no exercise reads the whole lab
            answer = params.get("answer")
            wanted.add((params["key"], None if answer is None else
                        answer if isinstance(answer, str) else _name(answer)))
        suite.wanted = wanted
        return suite

    # Class-scoped fixtures are classmethods (pytest runs them once per class, not per test
    # instance); the suite's methods are called on an instance of the lab's class.
    @pytest.fixture(scope="class")
    @classmethod
    def visible(cls, request) -> dict:
        suite = cls._suite_for(request, "visible")
        batch = suite._batch(("CORRECT", "WRONG", "WRONG_HIDDEN"))
        for ex, answers in suite.extra_visible().items():
            batch.setdefault(ex, {}).update(answers)
        return short_keys(harness.grade_batch(batch, timeout=suite.batch_timeout))

    @pytest.fixture(scope="class")
    @classmethod
    def hidden(cls, request) -> dict:
        suite = cls._suite_for(request, "hidden")
        return short_keys(harness.grade_batch(suite._batch(suite.hidden_tables), hidden=True,
                                              timeout=suite.batch_timeout))

    # ------------------------------------------------------------ the generic checks
    def test_the_tables_name_only_the_labs_exercises(self):
        for table in TABLES:
            unknown = set(self.table(table)) - set(self.exercises)
            assert not unknown, f"{table} names exercises the lab does not have: {sorted(unknown)}"

    def test_the_exercise_has_correct_and_wrong_answers(self, key):
        assert self.table("CORRECT").get(key), f"no correct answer written differently for {key!r}"
        assert self.table("WRONG").get(key) or self.table("ALONE").get(key), f"no wrong answer for {key!r}"

    test_the_exercise_has_correct_and_wrong_answers.each_exercise = (lambda ex: True, "tables")

    def test_correct_answer_passes_visible_and_hidden(self, visible, hidden, key, answer, words):
        assert visible[(key, _name(answer))] is None, visible[(key, _name(answer))]
        assert hidden[(key, _name(answer))] is None, hidden[(key, _name(answer))]

    test_correct_answer_passes_visible_and_hidden.rows = "CORRECT"

    def test_wrong_answer_fails_visible_naming_its_mistake(self, visible, key, answer, words):
        message = visible[(key, _name(answer))]
        assert message is not None, f"{_name(answer)} passed the visible {key} check"
        assert _says(message, words), message

    test_wrong_answer_fails_visible_naming_its_mistake.rows = "WRONG"

    def test_wrong_only_on_hidden_passes_visible_and_fails_hidden(self, visible, hidden, key, answer, words):
        assert visible[(key, _name(answer))] is None, visible[(key, _name(answer))]
        message = hidden[(key, _name(answer))]
        assert message is not None, f"{_name(answer)} passed the hidden {key} check"
        assert _says(message, words), message

    test_wrong_only_on_hidden_passes_visible_and_fails_hidden.rows = "WRONG_HIDDEN"

    def test_graded_alone_fails_naming_its_mistake(self, key, answer, words):
        check = harness.checker(self.exercises[key], "")
        with pytest.raises(AssertionError) as failed:
            check(answer, timeout=self.alone_timeout)
        assert _says(str(failed.value), words), str(failed.value)

    test_graded_alone_fails_naming_its_mistake.rows = "ALONE"

    def test_every_stated_rule_is_broken_by_some_wrong_answer(self, visible, hidden, key):
        """A rule no wrong answer breaks is a rule the tests never saw enforced."""
        messages = []
        for table, report in (("WRONG", visible), ("WRONG_HIDDEN", hidden)):
            messages += [report[(key, _name(a))] or "" for a, _ in self.table(table).get(key, [])]
        # the ALONE answers' messages hold their words: test_graded_alone_fails_naming_its_mistake
        messages += [" ".join(must(words)) for _, words in self.table("ALONE").get(key, [])]
        for rule in self.exercises[key].rules:
            assert any(self.breaks(rule, m) for m in messages), \
                f"no wrong answer for {key!r} breaks its rule {rule.says!r}"

    test_every_stated_rule_is_broken_by_some_wrong_answer.each_exercise = (lambda ex: bool(ex.rules), "rules")
