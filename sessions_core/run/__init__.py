"""One run's life: waiting its turn, the start, the model and tool loop, liveness, the finish.

    lifecycle.py   every status transition and the session lease (the one state machine)
    store.py       the rows a run writes besides its status (session, messages, state changes)
    base.py        what every run shares: its output, its events, how its work is executed and ended
    model_loop.py  the model and tool loop, the stop and the checkpoints of the partial reply
    root.py        RootRun: a caller's run, holding the session's lease; waits its turn, starts, stays alive
    finish.py      a root run's finish: its outcome, messages, state changes and the lease, in one transaction
                   (a pause is stored through it too)
    pause.py       ContinuedRun: a paused run's continuation, a new start of the same run
    child.py       ChildRun: a workflow's step or a team's member, inside a root run
    registry.py    this process's runs: stops asked for them, and waits for a session's lease
"""
