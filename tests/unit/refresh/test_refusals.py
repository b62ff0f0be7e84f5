"""An action refused for the refresh's state is worded one way everywhere (`errors.wrong_state`)."""

from types import SimpleNamespace

from controlplane.refresh.errors import InvalidTransition, wrong_state

REFRESH = SimpleNamespace(pk=7, state="running")


def test_a_refusal_names_the_state_it_wants():
    error = wrong_state(REFRESH, wanted="held")
    assert isinstance(error, InvalidTransition)
    assert error.code == "invalid_transition"
    assert str(error) == "policy refresh #7 is running, not held"


def test_a_refusal_can_say_why_instead():
    error = wrong_state(REFRESH, why="only an active refresh ends")
    assert str(error) == "policy refresh #7 is running; only an active refresh ends"
