"""Issue 23: an unreachable hostfile host ended in DeepSpeed's runner traceback (it ssh-checks only
the first host). deepy.py now asks every active host first and names each unreachable one with
ssh's reason and the fix, exit 2, before the runner starts anything."""

import pytest

from megatron import errors
from megatron.errors import UserError
from megatron.launch import hosts


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


def test_dry_run_prints_the_launch_layout_and_warns_for_unresolved_hosts(tmp_path, monkeypatch, capsys,
                                                                        token_dataset):
    """Issue 45: `--dry-run` with configs/cluster/hostfile.yml exited 0 showing no hosts, slots or
    process count, with example hosts that exist nowhere. It now prints the launch (hosts, slots,
    ranks, processes, launcher) and warns for each host whose name does not resolve, contacting none."""
    from megatron.launch import launcher
    from tests.conftest import train_config_dict, write_yaml

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\nnode-b.invalid slots=2\n")
    conf = write_yaml(tmp_path / "c.yml", train_config_dict(tmp_path, token_dataset, hostfile=str(hostfile)))
    monkeypatch.setattr("megatron.launch.hosts.unreachable", lambda *a: pytest.fail("ssh was tried in a dry run"))
    assert launcher.main(["--dry-run", "train.py", conf]) == 0
    out = capsys.readouterr().out
    assert "launcher pdsh" in out and "2 host(s), 4 processes, rendezvous localhost:" in out, out
    assert "  localhost: slots 2, ranks 0-1\n  node-b.invalid: slots 2, ranks 2-3" in out
    assert "warning: host 'node-b.invalid' does not resolve" in out and "host 'localhost'" not in out
    # a num-gpus the slots contradict is the launch's refusal, said by the dry run too
    other = write_yaml(tmp_path / "d.yml", train_config_dict(tmp_path, token_dataset, hostfile=str(hostfile),
                                                             num_gpus=1))
    with pytest.raises(UserError, match="num-gpus: 1 disagrees with the hostfile"):
        launcher.main(["--dry-run", "train.py", other])
    conf1 = write_yaml(tmp_path / "e.yml", train_config_dict(tmp_path, token_dataset))
    assert launcher.main(["--dry-run", "train.py", conf1]) == 0
    assert "launch: 1 process, here (no launcher)" in capsys.readouterr().out
