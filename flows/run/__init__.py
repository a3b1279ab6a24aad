"""The bookkeeping of one fine-tune run, beside the flows that use it.

- ``inputs``       every pre-rent check in one call (``prepare_run``, ``check_run``)
- ``providers``    the provider and SSH key rebuilt from the run's parameters; ``planned_pod``
- ``pod_session``  the work of the run on one pod: bring up, work, bring back (``PodSession``)
- ``attempts``     one pod of the run (``PodAttempt``), the single-pod fields as its views
- ``budget``       the run's spend so far against ``max_cost_usd`` (``RunBudget``)
- ``ledger``       each stage's record in the ``RunReport``, once per pod attempt (``run_stage``)
- ``report``       the ``RunReport`` and the summary printed at the end
- ``heartbeat``    the flow's side of the dead-man switch
- ``logs``         how much a run logs, on Prefect and on the console
- ``cost_record``  the ``finetune-costs`` record: who ended the pod, when, what it cost
- ``provider_bill`` each pod's bill from its provider (RunPod's REST v2 billing) in the record
- ``continuation`` a run continued by another (``--resume-from``): carried attempts, ``continued_by``
- ``artifacts``    the run's model links
- ``end``          the run's end: terminate, record, settle, write the report
- ``guardian``     the local process that ends the pod if the run dies before the dead-man is armed
- ``crashed``      a killed run set Crashed with the cause, by whoever ends its pod
- ``cancel_watch`` a cancel in Prefect stops the run, whoever executes it (``CancelWatch``)

See docs/architecture.md#the-runs-bookkeeping and docs/architecture.md#the-runs-attempts.
"""
