"""Where the pod publishes the outputs: one class per kind of destination behind one
protocol, found by name in a registry (docs/architecture.md#publish-from-the-pod).

- ``base``  ``PublishKind`` (the protocol, with defaults), ``PublishTarget``, the
  registry (``publish_kind``, ``register_publish_kind``) and ``publisher_command``
- ``hub``   ``HubPublish``: ``hf:ORG/REPO[@BRANCH]``, a Hugging Face model repo
- ``s3``    ``S3Publish``: ``s3[:PREFIX]``, the run's ``S3Target`` bucket
"""

from __future__ import annotations

from prefect_runpod.blocks.publish.base import (
    PublishKind,
    PublishTarget,
    publish_forms,
    publish_kind,
    publish_kind_names,
    publisher_command,
    register_publish_kind,
    unregister_publish_kind,
)

__all__ = [
    "PublishKind",
    "PublishTarget",
    "publish_forms",
    "publish_kind",
    "publish_kind_names",
    "publisher_command",
    "register_publish_kind",
    "unregister_publish_kind",
]
