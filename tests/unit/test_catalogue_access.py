"""The catalogue's topic permissions and user and vhost limits: commands, snapshots, definitions.

Pure state-machine tests (no node): what each command does to the records, that deleting a
user or a vhost takes their topic permissions with it, that equal histories give equal
snapshots, and that the definitions document carries topic permissions and limits both ways
(`hutch.broker.definitions`, the importer and exporter the HTTP API uses).
"""

from __future__ import annotations

from hutch.broker import definitions as defs
from hutch.cluster import catalogue as cat


def base() -> cat.Catalogue:
    c = cat.Catalogue()
    for cmd in (cat.AddVhost("/"), cat.AddVhost("shop"), cat.PutUser("ann", "h1"), cat.PutUser("bob", "h2")):
        assert c.apply(cmd).ok
    return c


def test_topic_permissions_are_set_replaced_and_cleared_per_exchange_or_all():
    c = base()
    assert c.apply(cat.SetTopicPermissions("ann", "shop", "events", "^ann\\.", ".*")).status == cat.CREATED
    assert c.apply(cat.SetTopicPermissions("ann", "shop", "amq.topic", "^a", "^b")).status == cat.CREATED
    assert c.apply(cat.SetTopicPermissions("ann", "shop", "events", "^ann\\.", ".*")).status == cat.EXISTED
    assert c.apply(cat.SetTopicPermissions("ann", "shop", "events", "^x", ".*")).status == cat.UPDATED
    assert c.topic_permission("ann", "shop", "events").write == "^x"
    assert c.apply(cat.ClearTopicPermissions("ann", "shop", "events")).status == cat.DELETED
    assert c.apply(cat.ClearTopicPermissions("ann", "shop", "events")).status == cat.ABSENT
    assert c.apply(cat.ClearTopicPermissions("ann", "shop")).status == cat.DELETED
    assert c.topic_permissions == {}


def test_topic_permissions_refuse_unknown_users_vhosts_and_bad_regexes():
    c = base()
    res = c.apply(cat.SetTopicPermissions("nobody", "shop", "x", ".*", ".*"))
    assert (res.code, res.text) == (cat.NOT_FOUND, "user 'nobody' not found")
    assert c.apply(cat.SetTopicPermissions("ann", "nowhere", "x", ".*", ".*")).code == cat.NOT_FOUND
    res = c.apply(cat.SetTopicPermissions("ann", "shop", "x", "(", ".*"))
    assert res.code == cat.PRECONDITION_FAILED and "write topic permission '('" in res.text


def test_deleting_a_user_or_a_vhost_deletes_its_topic_permissions():
    c = base()
    c.apply(cat.SetTopicPermissions("ann", "shop", "x", ".*", ".*"))
    c.apply(cat.SetTopicPermissions("bob", "shop", "x", ".*", ".*"))
    c.apply(cat.SetTopicPermissions("bob", "/", "x", ".*", ".*"))
    c.apply(cat.DeleteUser("ann"))
    assert sorted(c.topic_permissions) == [("bob", "/", "x"), ("bob", "shop", "x")]
    c.apply(cat.DeleteVhost("shop"))
    assert sorted(c.topic_permissions) == [("bob", "/", "x")]


def test_user_limits_are_merged_kept_across_a_password_change_and_cleared():
    c = base()
    assert c.apply(cat.SetUserLimits("ann", {"max-connections": 2})).ok
    assert c.apply(cat.SetUserLimits("ann", {"max-channels": 5})).ok
    assert c.users["ann"].limits == {"max-channels": 5, "max-connections": 2}
    c.apply(cat.PutUser("ann", "new-hash"))  # a password change keeps the limits
    assert c.users["ann"].limits == {"max-channels": 5, "max-connections": 2}
    assert c.apply(cat.ClearUserLimits("ann", "max-channels")).status == cat.DELETED
    assert c.apply(cat.ClearUserLimits("ann", "max-channels")).status == cat.ABSENT
    assert c.apply(cat.ClearUserLimits("ann", "all")).status == cat.DELETED
    assert c.users["ann"].limits == {}
    assert c.apply(cat.SetUserLimits("nobody", {"max-channels": 1})).code == cat.NOT_FOUND


def test_vhost_limits_are_the_vhost_limits_parameter():
    c = base()
    c.apply(cat.SetParameter(cat.VHOST_LIMITS, "shop", "limits", {"max-queues": 3}))
    assert c.vhost_limits("shop") == {"max-queues": 3}
    assert c.vhost_limits("/") == {}
    c.apply(cat.DeleteVhost("shop"))
    assert c.vhost_limits("shop") == {}


def test_equal_histories_give_equal_snapshots_and_a_snapshot_restores_everything():
    cmds = [cat.SetTopicPermissions("ann", "shop", "events", "^a", "^b"), cat.SetUserLimits("bob", {"max-channels": 3}),
            cat.SetParameter(cat.VHOST_LIMITS, "/", "limits", {"max-connections": 4})]
    a, b = base(), base()
    for cmd in cmds:
        a.apply(cmd)
        b.apply(cat.decode_command(cat.encode_command(cmd)))
    assert a.snapshot() == b.snapshot()
    restored = cat.Catalogue.from_snapshot(a.snapshot())
    assert restored.topic_permissions == a.topic_permissions
    assert restored.users["bob"].limits == {"max-channels": 3}
    assert restored.vhost_limits("/") == {"max-connections": 4}


def test_definitions_carry_topic_permissions_and_limits_both_ways():
    c = base()
    c.apply(cat.SetTopicPermissions("ann", "shop", "events", "^a", "^b"))
    c.apply(cat.SetUserLimits("ann", {"max-connections": 2}))
    c.apply(cat.SetParameter(cat.VHOST_LIMITS, "shop", "limits", {"max-queues": 3}))
    doc = defs.export(c, "test")
    assert doc["topic_permissions"] == [{"user": "ann", "vhost": "shop", "exchange": "events", "write": "^a",
                                         "read": "^b"}]
    assert next(u for u in doc["users"] if u["name"] == "ann")["limits"] == {"max-connections": 2}
    assert next(v for v in doc["vhosts"] if v["name"] == "shop")["limits"] == [["max-queues", 3]]
    plan = defs.plan(doc, defs.Context())
    assert plan.problems == []
    fresh = cat.Catalogue()
    for cmd in plan.commands:
        assert fresh.apply(cmd).ok, cmd
    assert fresh.topic_permissions == c.topic_permissions
    assert fresh.users["ann"].limits == {"max-connections": 2}
    assert fresh.vhost_limits("shop") == {"max-queues": 3}


def test_an_unknown_limit_in_a_document_is_refused_by_name():
    plan = defs.plan({"users": [{"name": "ann", "password_hash": "", "tags": [], "limits": {"max-queues": 3}}]},
                     defs.Context())
    assert plan.unsupported == ["user 'ann': user limit 'max-queues' is not supported (only max-channels, "
                                "max-connections)"]
