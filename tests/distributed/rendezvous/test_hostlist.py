"""SLURM host lists: what SLURM prints expands as SLURM's hostlist does; anything else is a
ValueError naming the variable and its value, never a master taken from half a list."""
import pytest

from neural_arch.distributed.rendezvous.env import expand_nodelist, resolve

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("nodelist, hosts", [
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),  # zero-padded bounds keep their width
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("node[5],x-y.z", ["node5", "x-y.z"]),
    ("rack[1-2]-gpu[9-10]", ["rack1-gpu9", "rack1-gpu10", "rack2-gpu9", "rack2-gpu10"]),
])
def test_what_slurm_prints_expands_in_order(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


MALFORMED = ["node[01-", "node[]", "node[3-1]", "node]", "node[1", "node[[1]]", "a]b[",
             "node[1,]", "node[-3]", "node[1-2-3]", "node[a-b]", "a,,b", ",", "node[0-99999999]"]


@pytest.mark.parametrize("nodelist", MALFORMED)
def test_a_malformed_list_is_an_error_naming_its_value(nodelist):
    with pytest.raises(ValueError, match="is not a SLURM host list") as info:
        expand_nodelist(nodelist)
    assert repr(nodelist) in str(info.value)


@pytest.mark.parametrize("variable", ["SLURM_STEP_NODELIST", "SLURM_NODELIST"])
@pytest.mark.parametrize("nodelist", MALFORMED)
def test_the_master_is_never_taken_from_a_malformed_list(variable, nodelist):
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "9", variable: nodelist}
    with pytest.raises(ValueError) as info:
        resolve(environ=env)
    assert f"{variable}={nodelist!r} is not a SLURM host list" in str(info.value)


def test_the_master_is_the_first_host_of_the_steps_list():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_NODELIST": "gpu[07-10]",
           "SLURM_STEP_NODELIST": "gpu[09-10],cpu1"}
    info = resolve(environ=env)
    assert info.master_addr == "gpu09"
    assert info.sources["master_addr"] == "SLURM_STEP_NODELIST=gpu[09-10],cpu1 (its first host)"
    # a huge range is checked, not expanded, to find its first host
    assert resolve(environ=dict(env, SLURM_STEP_NODELIST="n[0-999999]")).master_addr == "n0"
