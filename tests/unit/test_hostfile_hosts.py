"""Issue 23: an unreachable hostfile host ended in DeepSpeed's runner traceback (it ssh-checks only
the first host). deepy.py now asks every active host first and names each unreachable one with
ssh's reason and the fix, exit 2, before the runner starts anything."""

import pytest

from megatron import errors, hosts
from megatron.errors import UserError


def test_every_unreachable_host_is_named(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a.invalid slots=1\nnode-b.invalid slots=2\n")
    with pytest.raises(UserError) as e:
        hosts.check_hosts(str(hostfile))
    msg = str(e.value)
    assert f"hostfile '{hostfile}': 2 of 2 hosts cannot be reached" in msg
    assert "node-a.invalid: " in msg and "node-b.invalid: " in msg and "remove `hostfile:`" in msg
    with pytest.raises(UserError, match=r"1 of 1 hosts .*node-b\.invalid"):
        hosts.check_hosts(str(hostfile), exclude="node-a.invalid")


def test_a_bad_hostfile_line_is_one_message(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=one\n")
    with pytest.raises(UserError, match=r"hostfile .*bad entry.*<host> slots=<n>"):
        hosts.check_hosts(str(hostfile))


def test_deepy_refuses_before_the_runner(tmp_path, monkeypatch, capsys, token_dataset):
    from tests.conftest import deepy_exit, train_config_dict, write_yaml

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a.invalid slots=1\n")
    conf = write_yaml(tmp_path / "c.yml", train_config_dict(tmp_path, token_dataset, hostfile=str(hostfile)))
    monkeypatch.setattr("deepspeed.launcher.runner.main", lambda argv: pytest.fail("the runner was started"))
    code, err = deepy_exit(monkeypatch, capsys, conf)
    assert code == errors.EXIT_USER_ERROR and "Traceback" not in err
    assert "node-a.invalid: " in err and "passwordless ssh" in err
