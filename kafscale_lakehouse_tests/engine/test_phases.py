from kafscale_lakehouse.engine.phases import phase_listener, timed_phase


def test_listeners_hear_each_phase_only_while_subscribed():
    heard: list[tuple[str, float]] = []
    with phase_listener(lambda name, seconds: heard.append((name, seconds))):
        with timed_phase("plan"):
            pass
        try:
            with timed_phase("commit"):
                raise RuntimeError("boom")
        except RuntimeError:
            pass
    with timed_phase("after"):
        pass
    assert [name for name, _ in heard] == ["plan", "commit"]
    assert all(seconds >= 0 for _, seconds in heard)
