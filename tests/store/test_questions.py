"""Mid-call questions (`store.questions`): the first answer reaches the waiting worker, once;
a closed or unknown question takes none."""

from __future__ import annotations

import threading

import redis

from store import Store, new_run_id

QID = "0123456789abcdef"


def test_the_first_answer_reaches_the_waiting_worker_and_a_second_changes_nothing(store: Store) -> None:
    run_id = new_run_id()
    store.questions.open(run_id, QID, {"requester": "UANN"}, seconds=30)
    assert store.questions.get(run_id, QID) == {"requester": "UANN"}
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(store.questions.wait(run_id, QID, 20)))
    waiter.start()
    assert store.questions.answer(run_id, QID, {"action": "accept", "content": {"n": 1}})
    assert not store.questions.answer(run_id, QID, {"action": "decline"})
    waiter.join(20)
    assert got == [{"action": "accept", "content": {"n": 1}}]


def test_a_closed_or_unknown_question_takes_no_answer(store: Store, conn: redis.Redis) -> None:
    run_id = new_run_id()
    assert not store.questions.answer(run_id, QID, {"action": "accept"})  # never asked
    store.questions.open(run_id, QID, {"requester": "UANN"}, seconds=30)
    store.questions.close(run_id, QID)
    assert store.questions.get(run_id, QID) is None
    assert not store.questions.answer(run_id, QID, {"action": "accept", "content": {"secret": "x"}})
    assert not conn.keys(f"harness:question-answer:{run_id}:*")  # nothing of it lingers in Redis


def test_no_answer_in_time_is_none(store: Store) -> None:
    run_id = new_run_id()
    store.questions.open(run_id, QID, {}, seconds=30)
    assert store.questions.wait(run_id, QID, 1.0) is None
