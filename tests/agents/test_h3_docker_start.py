"""The docker runtime's start asks the engine little (agents/host/docker.py `run`): the
tenant network is checked once per process, and a create whose name is taken settles it.
Real engine and the locally built busybox image (tests/agents/test_docker_runtime.py)."""
from __future__ import annotations

from test_docker_runtime import TENANT_A, client, observed, runtime, spec  # noqa: F401 - fixtures

from agents.host.runtime import container_name


def test_a_tenant_network_removed_behind_the_runtimes_back_is_made_again(client, runtime):  # noqa: F811
    first = spec("h3-net-1", command=["sleep", "300"])
    runtime.run(first)
    network = first.network
    assert network in runtime._networks  # checked once; later starts do not ask again
    runtime.remove(first.instance_id)
    for net in client.networks.list(names=[network]):
        net.remove()  # an operator's clean-up, say
    second = spec("h3-net-2", command=["sleep", "300"])
    cid = runtime.run(second)
    assert observed(runtime, second.instance_id).state == "running"
    assert client.containers.get(container_name(second.instance_id)).id == cid
    assert [n.name for n in client.networks.list(names=[network]) if n.name == network] == [network]
    runtime.remove(second.instance_id)


def test_a_start_of_a_running_instance_is_that_container_and_an_exited_one_is_replaced(client, runtime):  # noqa: F811
    s = spec("h3-again", command=["sleep", "300"])
    cid = runtime.run(s)
    assert runtime.run(s) == cid  # the create's conflict: it runs, it is the answer
    client.containers.get(cid).kill()
    client.containers.get(cid).wait(timeout=30)
    again = runtime.run(s)
    assert again != cid and observed(runtime, s.instance_id).state == "running"
    runtime.remove(s.instance_id)
