"""Policies on recorded or synthetic candidate pools: the synthetic comparison (:mod:`.compare`),
trace recording and loading (:mod:`.trace`), and a trace's rows split per request (:mod:`.rows`)."""
