"""The cluster's quotas for tenants sharing it: one record in Ray's KV store, written by
``tpuslice quota set`` and read by the queue and every snapshot. Pure but for
:func:`read_quotas`. A tenant is a label, not a credential.
"""

from __future__ import annotations

import getpass
import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from tpuslice._tpu import _ray
from tpuslice._tpu.keys import NAMESPACE, QUOTAS_KEY
from tpuslice.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

DEFAULT_WEIGHT = 1.0
DEFAULT_GRACE_S = 30.0
"""A preempted tenant's time to leave: as long as GCE gives a Spot VM's preemption."""
DEFAULT_HALF_LIFE_S = 3600.0
"""Half-life of past usage: long against a job, so the split follows the weights, and short
enough that yesterday's use does not hold a tenant back today."""


TENANT_ENV = "TPUSLICE_TENANT"
"""The tenant a request is charged to when it names none (else the user's name)."""
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,62}")


def check_tenant(tenant: str) -> str:
    """A tenant's name, unchanged if valid, else :class:`InvalidArgumentError` naming the
    rule (1-63 letters, digits, ``.``, ``_``, ``@`` or ``-``, from a letter or digit)."""
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
        raise InvalidArgumentError(
            f"tenant {tenant!r}: give 1-63 letters, digits, '.', '_', '@' or '-', "
            "starting with a letter or digit (such as team-a)"
        )
    return tenant


def default_tenant() -> str:
    """The tenant of a request that names none: ``TPUSLICE_TENANT`` (an invalid one
    raises :class:`InvalidArgumentError`), else the user's name."""
    named = os.environ.get(TENANT_ENV, "").strip()
    if named:
        try:
            return check_tenant(named)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{TENANT_ENV}: {exc}") from exc
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (some containers)
        user = f"uid-{os.getuid()}"
    cleaned = re.sub(r"[^A-Za-z0-9._@-]", "-", user).lstrip("._@-")[:63]
    return cleaned or "default"


class Standing(IntEnum):
    """Where a grant would put its tenant, in serving order (lower first)."""

    WITHIN = 0
    BORROWING = 1
    NO_QUOTA = 2


def quota_keys(kind: str) -> tuple[str, str]:
    """The quota keys that can name a kind (``v6e-16 4x4 ...``): ``(pod type, "pod type
    topology")``."""
    words = kind.split()
    pod_type = words[0] if words else kind
    return pod_type, " ".join(words[:2])


@dataclass(frozen=True)
class TenantQuota:
    """One tenant's share of the cluster: its weight in fair share, and how long its
    preempted work has to leave."""

    slices: Mapping[str, int] = field(default_factory=dict)
    """Quota key (``v6e-16`` or ``v6e-16 4x4``) -> nominal slices of that kind."""
    borrow_limit: int | None = None
    """Slices of a kind it may run beyond its quota (``None``: no limit)."""
    weight: float = DEFAULT_WEIGHT
    grace_s: float = DEFAULT_GRACE_S

    def __post_init__(self) -> None:
        for key, count in self.slices.items():
            if not key.strip() or isinstance(count, bool) or not isinstance(count, int):
                raise InvalidArgumentError(
                    f"quota {key!r}={count!r}: give a pod type (v6e-16) or a pod type and "
                    "topology (v6e-16 4x4) and a whole number of slices"
                )
            if count < 0:
                raise InvalidArgumentError(f"quota {key}={count}: a quota cannot be negative")
        if self.borrow_limit is not None and self.borrow_limit < 0:
            raise InvalidArgumentError(
                f"borrow limit {self.borrow_limit}: give 0 (no borrowing) or more, or none "
                "for no limit"
            )
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise InvalidArgumentError(f"weight {self.weight}: give a number above 0")
        if not (math.isfinite(self.grace_s) and self.grace_s >= 0):
            raise InvalidArgumentError(f"grace {self.grace_s} s: give 0 or more seconds")

    def key_for(self, kind: str) -> str:
        """The quota key that covers a kind: its pod type and topology if named, else its
        pod type if named, else the kind itself. Kinds with one key share one quota."""
        pod_type, exact = quota_keys(kind)
        if exact in self.slices:
            return exact
        return pod_type if pod_type in self.slices else kind

    def nominal(self, kind: str) -> int:
        """Its nominal slices of a kind (a topology's own entry wins over its pod type's)."""
        pod_type, exact = quota_keys(kind)
        if exact in self.slices:
            return self.slices[exact]
        return self.slices.get(pod_type, 0)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready form."""
        return {
            "slices": dict(self.slices),
            "borrow_limit": self.borrow_limit,
            "weight": self.weight,
            "grace_s": self.grace_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TenantQuota:
        """Read what :meth:`to_dict` wrote (``ValueError`` if it is not a quota)."""
        try:
            slices = data.get("slices", {})
            limit = data.get("borrow_limit")
            if not isinstance(slices, dict):
                raise TypeError("slices is not a mapping")
            return cls(
                slices={str(k): int(v) for k, v in slices.items()},
                borrow_limit=None if limit is None else int(str(limit)),
                weight=float(str(data.get("weight", DEFAULT_WEIGHT))),
                grace_s=float(str(data.get("grace_s", DEFAULT_GRACE_S))),
            )
        except (TypeError, InvalidArgumentError) as exc:
            raise ValueError(f"not a tenant quota: {exc}") from exc


@dataclass(frozen=True)
class Quotas:
    """The cluster's quotas: tenant -> its quota (none: the queue's plain order), and the
    half-life of past usage in fair share."""

    tenants: Mapping[str, TenantQuota] = field(default_factory=dict)
    half_life_s: float = DEFAULT_HALF_LIFE_S

    def __post_init__(self) -> None:
        if not (math.isfinite(self.half_life_s) and self.half_life_s > 0):
            raise InvalidArgumentError(f"half-life {self.half_life_s} s: give seconds above 0")

    @property
    def configured(self) -> bool:
        """Whether any tenant has a quota (else the queue's plain order holds)."""
        return bool(self.tenants)

    def of(self, tenant: str) -> TenantQuota | None:
        """A tenant's quota, if it has one."""
        return self.tenants.get(tenant)

    def nominal(self, tenant: str, kind: str) -> int:
        """A tenant's nominal slices of a kind (0 without a quota)."""
        quota = self.tenants.get(tenant)
        return 0 if quota is None else quota.nominal(kind)

    def covered(self, kind: str) -> int:
        """Slices of a kind that some tenant's quota covers."""
        return sum(q.nominal(kind) for q in self.tenants.values())

    def weight(self, tenant: str) -> float:
        """A tenant's weight in fair share (the default without a quota)."""
        quota = self.tenants.get(tenant)
        return DEFAULT_WEIGHT if quota is None else quota.weight

    def grace_s(self, tenant: str) -> float:
        """How long a tenant's preempted work has to leave, in seconds."""
        quota = self.tenants.get(tenant)
        return DEFAULT_GRACE_S if quota is None else quota.grace_s

    def key_for(self, tenant: str, kind: str) -> str:
        """The tenant's quota key that covers a kind (the kind itself without a quota)."""
        quota = self.tenants.get(tenant)
        return kind if quota is None else quota.key_for(kind)

    def standing(self, tenant: str, kind: str, held: int, more: int) -> Standing:
        """The standing a grant of ``more`` slices would give a tenant that holds (or is
        granted) ``held`` slices of a kind."""
        quota = self.tenants.get(tenant)
        if quota is None:
            return Standing.NO_QUOTA
        return Standing.WITHIN if held + more <= quota.nominal(kind) else Standing.BORROWING

    def with_tenant(self, tenant: str, quota: TenantQuota | None) -> Quotas:
        """These quotas with one tenant's set (or removed, with ``None``)."""
        tenants = {t: q for t, q in self.tenants.items() if t != tenant}
        if quota is not None:
            tenants[tenant] = quota
        return Quotas(dict(sorted(tenants.items())), self.half_life_s)

    def to_json(self) -> bytes:
        """Encode for the KV store, as UTF-8 JSON."""
        data = {
            "half_life_s": self.half_life_s,
            "tenants": {t: q.to_dict() for t, q in self.tenants.items()},
        }
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Quotas:
        """Decode what :meth:`to_json` wrote (``ValueError`` if they are not quotas)."""
        data = json.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("tenants", {}), dict):
            raise ValueError("not quotas: expected an object with a 'tenants' object")
        tenants = {str(t): TenantQuota.from_dict(q) for t, q in data.get("tenants", {}).items()}
        try:
            return cls(tenants, float(data.get("half_life_s", DEFAULT_HALF_LIFE_S)))
        except InvalidArgumentError as exc:
            raise ValueError(f"not quotas: {exc}") from exc


def describe_tenant(tenant: str) -> str:
    """How a message names a tenant: ``tenant team-a``, or ``no tenant`` for ``""``."""
    return f"tenant {tenant}" if tenant else "no tenant"


def read_quotas() -> Quotas:
    """The cluster's quotas; none when there is no record, no Ray, or an unreadable one."""
    raw = _ray.kv_get(QUOTAS_KEY, NAMESPACE)
    if raw is None:
        return Quotas()
    try:
        return Quotas.from_json(raw)
    except ValueError as exc:
        logger.warning("ignoring the cluster's unreadable quotas record: %s", exc)
        return Quotas()
