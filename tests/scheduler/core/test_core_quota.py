"""One home for the quota rules (scheduler/core/quota.py): the planner's book, the apply's re-check
under the tenants' locks and the launch service's refusal give one verdict for every rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import ClusterSnapshot, QuotaRule, TenantView
from scheduler.core.quota import QuotaBook, quota_applies, quota_fits, quota_never_fits_gpus
from scheduler.core.state import Fleet
from scheduler.core.testing import make_request


@given(
    max_gpus=st.none() | st.integers(0, 4),
    max_instances=st.none() | st.integers(0, 3),
    model=st.sampled_from((None, "H100", "A100")),
    region=st.sampled_from((None, "r1", "r2")),
    used_milli=st.integers(0, 5000),
    used_instances=st.integers(0, 4),
    size=st.sampled_from(((0, 500), (1, 1000), (2, 1000), (4, 1000))),
    where=st.sampled_from(("r1", "r2")),
)
def test_the_planner_the_apply_and_the_launch_agree(  # type: ignore[no-untyped-def]
    max_gpus, max_instances, model, region, used_milli, used_instances, size, where
):
    rule = QuotaRule(max_gpus=max_gpus, max_instances=max_instances, gpu_model=model, region=region,
                     used_gpu_milli=used_milli, used_instances=used_instances)
    snapshot = ClusterSnapshot(hosts=(), tenants=(TenantView(tenant_id="t1", quotas=(rule,)),))
    gpus, milli = size
    req = make_request("r", gpus_per_node=gpus, gpu_milli=milli, region=where)
    planner = QuotaBook(Fleet(snapshot, 0.0), snapshot).check(req, where)
    # the apply (scheduler/apply.py _within_quota) keeps a placement when every rule that counts it fits
    counts = quota_applies(rule, req.gpu_model, req.region)
    assert (planner is None) == (not counts or quota_fits(rule, used_milli, used_instances, req.total_milli))
    # the launch (scheduler/services.py) refuses at once what the planner would reject for good
    if counts and quota_never_fits_gpus(rule, req.total_milli):
        assert planner is not None and planner[0] is True
