"""The bookkeeping of one fine-tune run, beside the flows that use it.

- ``inputs``       every pre-rent check in one call (``prepare_run``, ``check_run``)
- ``providers``    the provider and SSH key rebuilt from the run's parameters; ``planned_pod``
- ``ledger``       each stage's record in the ``RunReport`` (``run_stage``, ``StageSkipped``)
- ``report``       the ``RunReport`` and the summary printed at the end
- ``heartbeat``    the flow's side of the dead-man switch
- ``logs``         how much a run logs, on Prefect and on the console
- ``cost_record``  the ``finetune-costs`` record: who ended the pod, when, what it cost
- ``artifacts``    the run's model links
- ``end``          the run's end: terminate, record, settle, write the report

See docs/architecture.md#layers-and-packages.
"""
