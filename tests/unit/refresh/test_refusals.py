"""An action refused for the state of a refresh or a quarantine is worded one way everywhere
(`errors.state_refusal`)."""

from types import SimpleNamespace

from controlplane.refresh.errors import InvalidTransition, wrong_state
from controlplane.refresh.quarantine import QuarantineRefused
from controlplane.refresh.quarantine import wrong_state as quarantine_wrong_state

REFRESH = SimpleNamespace(pk=7, state="running")


def test_a_refusal_names_the_state_it_wants():
    error = wrong_state(REFRESH, wanted="held")
    assert isinstance(error, InvalidTransition)
    assert error.code == "invalid_transition"
    assert str(error) == "policy refresh #7 is running, not held"


def test_a_refusal_can_say_why_instead():
    error = wrong_state(REFRESH, why="only an active refresh ends")
    assert str(error) == "policy refresh #7 is running; only an active refresh ends"


def test_a_quarantine_refusal_is_worded_as_a_refresh_one():
    error = quarantine_wrong_state(
        SimpleNamespace(pk=3, state="admitted"), why="only an open one is dropped"
    )
    assert isinstance(error, QuarantineRefused)
    assert error.messages == ["quarantine #3 is admitted; only an open one is dropped"]
