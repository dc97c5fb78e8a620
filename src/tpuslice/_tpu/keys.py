"""Every name tpuslice uses in Ray's GCS (KV namespaces, keys, named actors), in one place
so readers and writers cannot disagree. Host records (``tpu-*``) are keyed by node id."""

NAMESPACE = "tpuslice"  # the KV namespace, and that of tpuslice's named actors

OWNER_KEY_PREFIX = "tpu-owner/"  # the process that owns the host's TPU (its agent writes it)
NOTICE_KEY_PREFIX = "tpu-notice/"  # the host's most urgent notice standing (by its agent)
SUSPECT_KEY_PREFIX = "tpu-suspect/"  # the host failed a run lately: avoided for a cool-down
FREE_KEY_PREFIX = "tpu-free/"  # present while the agent last saw the host's TPU free
PREEMPT_KEY_PREFIX = "tpu-preempt/"  # the queue preempted the host's work: a notice as JSON
HOST_KEY_PREFIX = "tpu-"  # what every host record starts with, so one listing reads them all

SUSPECT_COOLDOWN_KEY = "suspect-cooldown-s"  # seconds as text; absent: the default
QUOTAS_KEY = "quotas"  # the tenants' quotas, as JSON
USAGE_KEY = "tenant-usage"  # decayed slice-seconds per tenant (JSON): fair share survives
QUEUE_KEY = "queue"  # the queue actor's record after each decision
HOLDER_KEY_PREFIX = "holder/"  # holder/<slice>: the reservation holding it, once held
EVENT_KEY_PREFIX = "event/"  # event/<ns since epoch>-<writer>-<n>: one timeline event
BEAT_KEY_PREFIX = "beat/"  # beat/<attempt id>/<rank>: newest heartbeat and checkpoint
SLICE_SECONDS_KEY_PREFIX = "slice-seconds/"  # <minute>: by pod type and state, as JSON
GOODPUT_KEY_PREFIX = "goodput/"  # goodput/<end ns>-<writer>-<n>: a run's account, as JSON
LAYOUT_KEY_PREFIX = "subslice-layout/"  # <slice>: its physical layout, once learned
HEALTH_KEY_PREFIX = "health/"  # health/<check id>/<slice>: where rank 0 listens (ip:port)

RAY_SUBSLICE_NAMESPACE = "tpu_subslice"  # Ray 2.60's, for sub-slice labels (.../<slice>)

AGENT_NAME_PREFIX = "tpuslice-host:"  # tpuslice-host:<node id>: a TPU host's detached agent
QUEUE_ACTOR_NAME = "tpuslice-queue"  # the cluster's detached queue actor
