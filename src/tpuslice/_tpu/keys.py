"""Every name tpuslice gives things in Ray's GCS: KV namespaces and keys, and named actors.

One place, so that a reader of the cluster (``tpuslice status``, the docs' table in
``docs/internals.md``) and its writers cannot disagree. The sub-slice labels are the one
entry in Ray's own namespace, in the format Ray 2.60 reads.
"""

NAMESPACE = "tpuslice"
"""tpuslice's KV namespace, and the namespace of its named actors."""

OWNER_KEY_PREFIX = "tpu-owner/"
"""``tpu-owner/<node id>``: the process that owns the host's TPU (a host agent writes it)."""
NOTICE_KEY_PREFIX = "tpu-notice/"
"""``tpu-notice/<node id>``: the host's most urgent notice standing (its agent writes it)."""
SUSPECT_KEY_PREFIX = "tpu-suspect/"
"""``tpu-suspect/<node id>``: the host failed a run lately (hang, host failure, worker crash,
health check) and is avoided until the record's cool-down ends (whoever saw it writes it)."""
FREE_KEY_PREFIX = "tpu-free/"
"""``tpu-free/<node id>``: present while the host's agent, which looks every half second,
last saw its TPU free (its agent writes and deletes it; only the key is read)."""
HOST_KEY_PREFIX = "tpu-"
"""What every host record above starts with, so one listing reads every host's records."""
SUSPECT_COOLDOWN_KEY = "suspect-cooldown-s"
"""The cluster's cool-down of a suspect host, in seconds as text (absent: the default)."""
QUOTAS_KEY = "quotas"
"""The cluster's quotas for tenants, as JSON (``tpuslice quota set`` writes it)."""
USAGE_KEY = "tenant-usage"
"""Each tenant's decayed slice-seconds and when they were counted, as JSON (the queue
actor writes it now and then, so a restarted queue keeps fair share)."""
HOLDER_KEY_PREFIX = "holder/"
"""``holder/<slice>``: the reservation holding the slice: its tenant, priority, whether it
may be preempted, and its placement groups (it writes it once held, deletes it at the
hand-back)."""
PREEMPT_KEY_PREFIX = "tpu-preempt/"
"""``tpu-preempt/<node id>``: the queue preempted the work on this host, a notice in the
format of a metadata server's (the queue writes it; the hand-back, or the queue once the
work is gone, deletes it)."""
QUEUE_KEY = "queue"
"""The queue's record after each decision (the queue actor writes it)."""
EVENT_KEY_PREFIX = "event/"
"""``event/<ns since epoch>-<writer>-<n>``: one timeline event (every driver writes them)."""
BEAT_KEY_PREFIX = "beat/"
"""``beat/<attempt id>/<rank>``: a rank's newest heartbeat and checkpoint (its progress)."""
SLICE_SECONDS_KEY_PREFIX = "slice-seconds/"
"""``slice-seconds/<minute, epoch seconds>``: the cluster's slice-seconds by pod type and
state in that minute, as JSON (the queue actor writes them)."""
GOODPUT_KEY_PREFIX = "goodput/"
"""``goodput/<end ns>-<writer>-<n>``: a run's goodput account, as JSON."""
LAYOUT_KEY_PREFIX = "subslice-layout/"
"""``subslice-layout/<slice>``: a slice's physical layout, once learned."""
HEALTH_KEY_PREFIX = "health/"
"""``health/<check id>/<slice>``: where a health check's rank 0 listens (``ip:port``),
for the other ranks to connect to; deleted when the check ends."""

RAY_SUBSLICE_NAMESPACE = "tpu_subslice"
"""Ray 2.60's namespace for a slice's sub-slice labels (``tpu_subslice/<slice>``)."""

AGENT_NAME_PREFIX = "tpuslice-host:"
"""``tpuslice-host:<node id>``: the detached host agent of one TPU host."""
QUEUE_ACTOR_NAME = "tpuslice-queue"
"""The cluster's detached queue actor."""
