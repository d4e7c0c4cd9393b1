"""Checks for Lab 04: pipeline parallelism, on the grading harness.

    lab04.check_pipeline_forward_backward(pipeline_forward_backward)   # Exercise 1
    lab04.check_gpipe(gpipe_step)                                      # Exercise 2
    lab04.check_1f1b(one_f_one_b_step)                                 # Exercise 3
    lab04.check_bubble(measured_bubble)                                # Exercise 4
    lab04.check_prediction(predict_pipeline)                           # Exercise 5

``schedules`` holds exercises 1-3's cases, runner (rank r trains stage r of a
small GPT), grader (against one process on the whole batch) and hints;
``rules`` their rules, judged on the spy's records: which messages each stage
sent, and when each forward ran relative to the backward passes, so that an
"1F1B" that runs every forward first loses its points although its numbers
are right.  ``bubble`` holds exercise 4, ``prediction`` exercise 5.
"""
from __future__ import annotations

from ..harness import Exercise, checker
from . import bubble, prediction, rules, schedules

__all__ = ["check_pipeline_forward_backward", "check_gpipe", "check_1f1b", "check_bubble",
           "check_prediction", "EXERCISES"]

SINGLE = Exercise(key="lab04.single", answer="pipeline_forward_backward", run=schedules.run_single,
                  grade=schedules.grade, visible=schedules.SINGLE_VISIBLE, hidden=schedules.SINGLE_HIDDEN,
                  rules=rules.COMMON, **schedules.OPTIONS)
GPIPE = Exercise(key="lab04.gpipe", answer="gpipe_step", run=schedules.run, grade=schedules.grade,
                 visible=schedules.GPIPE_VISIBLE, hidden=schedules.GPIPE_HIDDEN, rules=rules.GPIPE,
                 **schedules.OPTIONS)
ONE_F_ONE_B = Exercise(key="lab04.1f1b", answer="one_f_one_b_step", run=schedules.run, grade=schedules.grade,
                       visible=schedules.ONE_F_ONE_B_VISIBLE, hidden=schedules.ONE_F_ONE_B_HIDDEN,
                       rules=rules.ONE_F_ONE_B, **schedules.OPTIONS)
BUBBLE = Exercise(key="lab04.bubble", answer="measured_bubble", run=bubble.run, grade=bubble.grade,
                  visible=bubble.VISIBLE, hidden=bubble.HIDDEN, solo=True)
PREDICTION = Exercise(key="lab04.prediction", answer="predict_pipeline", run=prediction.run,
                      grade=prediction.grade, visible=prediction.VISIBLE, hidden=prediction.HIDDEN,
                      rules=prediction.RULES, solo=True)

EXERCISES = {"single": SINGLE, "gpipe": GPIPE, "1f1b": ONE_F_ONE_B, "bubble": BUBBLE,
             "prediction": PREDICTION}

check_pipeline_forward_backward = checker(SINGLE, """Exercise 1: ``fn(stage, x, y, shape)`` runs
one micro-batch forward and backward through the pipeline; returns the loss on the last stage.""")
check_gpipe = checker(GPIPE, """Exercise 2: ``fn(stage, micro_batches, shape)``, GPipe: every
forward, then every backward; returns the mean loss on the last stage.""")
check_1f1b = checker(ONE_F_ONE_B, """Exercise 3: ``fn(stage, micro_batches, shape)``, 1F1B
(PipeDream-Flush); returns the mean loss on the last stage.""")
check_bubble = checker(BUBBLE, """Exercise 4: ``fn(spans) -> float``, the idle share of a pipeline
step (mean over stages), from traced forward and backward spans.""")
check_prediction = checker(PREDICTION, """Exercise 5: ``fn(p, m, schedule, rank, mb_bytes) ->
(bubble, held_bytes)``.""")
