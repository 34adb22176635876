"""The management web UI in a real browser (Debian's headless chromium through chromedriver)
against a real 3-node hutch cluster.

What a RabbitMQ user does first: open the management port, log in, look at the overview
and its nodes, set a mirroring policy through the policy form (seed 000, "How Mirroring is
Configured": `ha-mode: all`), declare a queue that matches it and watch the queue list show
its mirrors as a blue `+2` once both are synchronised; publish on an exchange's page and get
the message on the queue's page; delete a queue. A monitoring user is offered no policy form,
and a wrong password is refused on the login form.

One cluster and one browser serve the whole module; every wait is a WebDriverWait on a
condition. With HUTCH_UI_SCREENSHOTS=<dir> set, the tests also save the screenshots shown
in docs/ui.md (ui-login.png, ui-overview.png, ui-queues.png, ui-queue.png, ui-policy.png).
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from tests.support.hutch_cluster import HutchCluster  # noqa: E402

pytestmark = pytest.mark.timeout(300)

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
WAIT_S = 30
SHOTS = os.environ.get("HUTCH_UI_SCREENSHOTS")

if not (os.path.exists(CHROMEDRIVER) and os.path.exists(CHROMIUM)):  # a missing browser fails, never skips
    raise RuntimeError("chromium and chromedriver are not installed: `make install` installs them (apt-get)")


# ------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def cluster():
    with HutchCluster(n=3) as c:
        yield c


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(downloads):
    opts = Options()
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(autouse=True)
def no_script_errors(browser):
    """A test fails when the page logged a JavaScript error (refused HTTP requests, which the
    page shows as messages, are not script errors)."""
    browser.get_log("browser")  # drop what earlier tests left
    yield
    errors = [e["message"] for e in browser.get_log("browser")
              if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]
    assert not errors, errors


# -------------------------------------------------------------------------------- helpers

def base(cluster: HutchCluster, i: int = 0) -> str:
    return f"http://127.0.0.1:{cluster.nodes[i].mgmt_port}"


def http(cluster: HutchCluster, method: str, path: str, body=None, user: str = "guest", password: str = "guest"):
    req = urllib.request.Request(base(cluster) + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw and resp.headers.get_content_type() == "application/json" else raw)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait(browser, cond, what: str, timeout_s: float = WAIT_S):
    return WebDriverWait(browser, timeout_s, ignored_exceptions=(StaleElementReferenceException,)).until(cond, what)


def visible(browser, css: str, timeout_s: float = WAIT_S):
    return wait(browser, ec.visibility_of_element_located((By.CSS_SELECTOR, css)), f"{css} visible", timeout_s)


def text_in(browser, css: str, text: str, timeout_s: float = WAIT_S):
    wait(browser, ec.text_to_be_present_in_element((By.CSS_SELECTOR, css), text), f"{text!r} in {css}", timeout_s)


def go(browser, cluster, hash_: str) -> None:
    browser.get(f"{base(cluster)}/#{hash_}")


def logout(browser, cluster) -> None:
    go(browser, cluster, "/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(base(cluster) + "/")
    visible(browser, "form#login")


def login(browser, cluster, user: str = "guest", password: str = "guest") -> None:
    logout(browser, cluster)
    browser.find_element(By.ID, "username").send_keys(user)
    browser.find_element(By.ID, "password").send_keys(password)
    browser.find_element(By.ID, "login-button").click()
    text_in(browser, "#whoami", user)


def texts(browser, css: str) -> list[str]:
    """The text of every element matching `css`, read in one script run (the page redraws its
    tables every few seconds, so elements found earlier may be gone by the time they are read)."""
    return browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent.trim())", css)


def accept_confirm(browser) -> None:
    wait(browser, ec.alert_is_present(), "a confirmation dialog").accept()


def shot(browser, name: str, scroll_to: str | None = None) -> None:
    """Save docs/img-style screenshot `ui-<name>.png` (only with HUTCH_UI_SCREENSHOTS set), the
    page scrolled to the top or to the element `scroll_to`."""
    if not SHOTS:
        return
    out = Path(SHOTS)
    out.mkdir(parents=True, exist_ok=True)
    if scroll_to:
        browser.execute_script("document.querySelector(arguments[0]).scrollIntoView()", scroll_to)
    else:
        browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(out / f"ui-{name}.png"))


def form_field(form, name: str):
    return form.find_element(By.NAME, name)


def queue_row(browser, name: str):
    """The queue list's row for `name` (None while absent); use it inside a wait, which
    retries when the page redraws the row under it."""
    for link in browser.find_elements(By.CSS_SELECTOR, "#queues a.queue-link"):
        if link.text == name:
            return link.find_element(By.XPATH, "./ancestor::tr")
    return None


# ---------------------------------------------------------------------------------- tests

def test_ui_is_served_at_root_and_api_404s_stay_json(cluster):
    with urllib.request.urlopen(base(cluster) + "/", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers.get_content_type() == "text/html"
        assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
        page = resp.read().decode()
    assert 'src="ui/js/app.js"' in page and "cdn" not in page.lower()
    with urllib.request.urlopen(base(cluster) + "/ui/js/app.js", timeout=10) as resp:
        assert resp.status == 200 and "javascript" in resp.headers.get_content_type()
    status, body = http(cluster, "GET", "/api/no-such-route")
    assert (status, body) == (404, {"error": "Object Not Found", "reason": "Not Found"})
    status, body = http(cluster, "GET", "/ui/../../pyproject.toml")
    assert status == 404


def test_wrong_password_shows_login_failed(browser, cluster):
    logout(browser, cluster)
    shot(browser, "login")
    browser.find_element(By.ID, "username").send_keys("guest")
    browser.find_element(By.ID, "password").send_keys("not-the-password")
    browser.find_element(By.ID, "login-button").click()
    text_in(browser, "#login-error", "Login failed")
    assert browser.find_elements(By.ID, "tabs") == []
    assert browser.execute_script("return sessionStorage.getItem('hutch.login')") is None


def test_overview_shows_the_three_nodes(browser, cluster):
    login(browser, cluster)
    go(browser, cluster, "/")
    wait(browser, lambda b: len(texts(b, "#nodes tbody .node-name")) == 3, "three nodes listed")
    assert sorted(texts(browser, "#nodes tbody .node-name")) == sorted(cluster.names)
    wait(browser, lambda b: sorted(texts(b, "#nodes tbody tr td:nth-child(7)")) == ["follower", "follower", "leader"],
         "one metadata leader and two followers")
    tabs = texts(browser, "#tabs a")
    assert tabs == ["Overview", "Connections", "Channels", "Exchanges", "Queues", "Admin"]
    visible(browser, "svg.chart")
    text_in(browser, "#listeners", "amqp")


def test_policy_form_mirrors_a_queue_and_the_badge_turns_blue(browser, cluster):
    login(browser, cluster)
    go(browser, cluster, "/policies")
    form = visible(browser, "form#add-policy")
    form_field(form, "name").send_keys("ha-all")
    form_field(form, "pattern").send_keys(r"^ha\.")
    Select(form_field(form, "apply-to")).select_by_value("queues")
    form.find_element(By.CSS_SELECTOR, "a.helper[data-key='ha-mode']").click()
    row = form.find_elements(By.CSS_SELECTOR, ".kv tr")[0]
    assert row.find_element(By.CSS_SELECTOR, ".kv-key").get_attribute("value") == "ha-mode"
    row.find_element(By.CSS_SELECTOR, ".kv-value").send_keys("all")
    form.find_element(By.CSS_SELECTOR, "a.helper[data-key='ha-sync-mode']").click()
    form.find_elements(By.CSS_SELECTOR, ".kv tr")[1].find_element(By.CSS_SELECTOR, ".kv-value").send_keys("automatic")
    shot(browser, "policy", scroll_to="form#add-policy")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "main", "Policy set.")
    text_in(browser, "#policy-list", "ha-all")
    status, policy = http(cluster, "GET", "/api/policies/%2F/ha-all")
    assert status == 200 and policy["definition"] == {"ha-mode": "all", "ha-sync-mode": "automatic"}

    go(browser, cluster, "/queues")
    form = visible(browser, "form#add-queue")
    form_field(form, "name").send_keys("ha.orders")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "main", "Queue added.")

    def badge_blue(b):
        row = queue_row(b, "ha.orders")
        if row is None:
            return False
        synced = [e.text for e in row.find_elements(By.CSS_SELECTOR, ".mirror.synced")]
        unsynced = row.find_elements(By.CSS_SELECTOR, ".mirror.unsynced")
        return synced == ["+2"] and not unsynced
    wait(browser, badge_blue, "ha.orders shown with a blue +2", timeout_s=60)
    colour = browser.execute_script("return getComputedStyle(document.querySelector('#queues .mirror.synced')).backgroundColor")
    assert colour == "rgb(45, 108, 223)"  # --blue
    assert "ha-all" in texts(browser, "#queues .features .policy")
    shot(browser, "queues")


def test_publish_on_exchange_page_and_get_on_queue_page(browser, cluster):
    assert http(cluster, "PUT", "/api/queues/%2F/ui.inbox", {"durable": True})[0] in (201, 204)
    login(browser, cluster)
    go(browser, cluster, "/exchanges/%2F/amq.direct")
    bind = visible(browser, "form.bind")
    form_field(bind, "bind-other").send_keys("ui.inbox")
    form_field(bind, "bind-routing-key").send_keys("inbox")
    bind.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "#bindings-source", "ui.inbox")

    publish = visible(browser, "form.publish")
    form_field(publish, "routing_key").send_keys("nowhere")
    form_field(publish, "payload").send_keys("lost")
    publish.find_element(By.CSS_SELECTOR, "button.publish-button").click()
    text_in(browser, ".publish-result", "Message published, but not routed.")
    form_field(publish, "routing_key").clear()
    form_field(publish, "routing_key").send_keys("inbox")
    form_field(publish, "payload").clear()
    form_field(publish, "payload").send_keys("hello from the browser")
    publish.find_element(By.CSS_SELECTOR, "button.publish-button").click()
    text_in(browser, ".publish-result", "Message published.")
    assert "not routed" not in browser.find_element(By.CSS_SELECTOR, ".publish-result").text

    go(browser, cluster, "/queues/%2F/ui.inbox")
    text_in(browser, "#q-ready", "1")
    get = visible(browser, "form#get-messages")
    options = [o.text for o in Select(form_field(get, "ackmode")).options]
    assert options == ["Nack message requeue true", "Automatic ack", "Reject requeue true", "Reject requeue false"]
    get.find_element(By.CSS_SELECTOR, "button.get-button").click()
    text_in(browser, "#get-result pre.payload", "hello from the browser")
    text_in(browser, "#get-result", "amq.direct")
    shot(browser, "queue")
    Select(form_field(get, "ackmode")).select_by_visible_text("Automatic ack")
    get.find_element(By.CSS_SELECTOR, "button.get-button").click()  # requeued above: still there, taken now
    text_in(browser, "#get-result pre.payload", "hello from the browser")
    wait(browser, lambda b: http(cluster, "GET", "/api/queues/%2F/ui.inbox")[1]["messages"] == 0, "ui.inbox empty")


def test_monitoring_user_is_offered_no_policy_form(browser, cluster):
    assert http(cluster, "PUT", "/api/users/watcher", {"password": "w4tch", "tags": "monitoring"})[0] in (201, 204)
    login(browser, cluster, "watcher", "w4tch")
    go(browser, cluster, "/")
    wait(browser, lambda b: len(texts(b, "#nodes tbody .node-name")) == 3, "nodes for monitoring")
    tabs = texts(browser, "#tabs a")
    assert "Admin" not in tabs and "Queues" in tabs
    go(browser, cluster, "/policies")
    text_in(browser, "main", "needs the policymaker tag")
    assert browser.find_elements(By.CSS_SELECTOR, "form#add-policy") == []
    assert browser.find_elements(By.CSS_SELECTOR, "form.policy-form") == []
    logout(browser, cluster)


def test_delete_a_queue_from_its_page(browser, cluster):
    assert http(cluster, "PUT", "/api/queues/%2F/ui.doomed", {"durable": False})[0] in (201, 204)
    login(browser, cluster)
    go(browser, cluster, "/queues")
    wait(browser, lambda b: "ui.doomed" in texts(b, "#queues a.queue-link"), "ui.doomed listed")
    go(browser, cluster, "/queues/%2F/ui.doomed")
    visible(browser, "#delete-queue").click()
    accept_confirm(browser)
    wait(browser, lambda b: b.execute_script("return location.hash") == "#/queues", "back on the queue list")
    wait(browser, lambda b: "ha.orders" in texts(b, "#queues a.queue-link") and "ui.doomed" not in texts(b, "#queues a.queue-link"),
         "ui.doomed gone from the list")
    assert http(cluster, "GET", "/api/queues/%2F/ui.doomed")[0] == 404


def test_management_user_sees_no_admin_and_no_nodes(browser, cluster):
    assert http(cluster, "PUT", "/api/users/dev", {"password": "d3v", "tags": "management"})[0] in (201, 204)
    assert http(cluster, "PUT", "/api/permissions/%2F/dev", {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    login(browser, cluster, "dev", "d3v")
    go(browser, cluster, "/")
    text_in(browser, "#listeners", "amqp")
    assert texts(browser, "#tabs a") == ["Overview", "Connections", "Channels", "Exchanges", "Queues"]
    assert browser.find_elements(By.ID, "nodes") == []
    go(browser, cluster, "/users")
    text_in(browser, "main", "needs the administrator tag")
    assert browser.find_elements(By.CSS_SELECTOR, "form#add-user") == []
    go(browser, cluster, "/queues")
    wait(browser, lambda b: "ha.orders" in texts(b, "#queues a.queue-link"), "dev sees the queues of /")
    logout(browser, cluster)


def test_overview_counts_queued_messages(browser, cluster):
    """Last, so the overview has messages to show (and its screenshot something to draw)."""
    assert http(cluster, "PUT", "/api/queues/%2F/ui.backlog", {"durable": True})[0] in (201, 204)
    for i in range(25):
        status, body = http(cluster, "POST", "/api/exchanges/%2F/amq.default/publish",
                            {"routing_key": "ui.backlog", "payload": f"m{i}", "payload_encoding": "string", "properties": {}})
        assert status == 200 and body["routed"], body
    login(browser, cluster)
    go(browser, cluster, "/")
    wait(browser, lambda b: len(texts(b, "#nodes tbody .node-name")) == 3, "three nodes listed")
    text_in(browser, "[data-total=total]", "25")
    text_in(browser, "[data-total=ready]", "25")
    text_in(browser, ".chart-cell .legend", "Ready 25")  # the chart ends at the current totals
    shot(browser, "overview")


# ------------------------------------------------------------- the other pages and actions

def amqp(cluster: HutchCluster, i: int = 0):
    import pika
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[i].amqp_port, heartbeat=0))


def test_channels_show_prefetch_and_unacked_and_a_connection_is_closed(browser, cluster):
    import pika.exceptions
    assert http(cluster, "PUT", "/api/queues/%2F/ui.work", {"durable": True})[0] in (201, 204)
    conn = amqp(cluster)
    try:
        ch = conn.channel()
        for i in range(3):
            ch.basic_publish("", "ui.work", f"job {i}".encode())
        ch.basic_qos(prefetch_count=7)
        ch.basic_consume("ui.work", lambda *a: None)  # never acks: three unacked
        wait(browser, lambda b: (conn.process_data_events(0) or True)
             and http(cluster, "GET", "/api/queues/%2F/ui.work")[1]["messages_unacknowledged"] == 3, "three unacked")
        login(browser, cluster)
        go(browser, cluster, "/channels")
        wait(browser, lambda b: texts(b, "#channels tbody tr td:nth-child(8)") == ["7"], "prefetch 7 listed")
        assert texts(browser, "#channels tbody tr td:nth-child(9)") == ["3"]

        go(browser, cluster, "/connections")
        wait(browser, lambda b: len(texts(b, "#connections tbody td.name a")) == 1, "the connection listed")
        browser.find_element(By.CSS_SELECTOR, "#connections tbody td.name a").click()
        text_in(browser, "main", "Force Close")
        browser.find_element(By.XPATH, "//button[text()='Force Close']").click()
        text_in(browser, "main", "Connection closed.")

        def closed(_b) -> bool:
            try:
                conn.process_data_events(0)
            except pika.exceptions.ConnectionClosedByBroker as e:
                return e.reply_code == 320 and "Closed via management plugin" in e.reply_text
            return False
        wait(browser, closed, "the client told 320 CONNECTION_FORCED")
    finally:
        if conn.is_open:
            conn.close()


def test_add_an_exchange_and_delete_it(browser, cluster):
    login(browser, cluster)
    go(browser, cluster, "/exchanges")
    form = visible(browser, "form#add-exchange")
    form_field(form, "name").send_keys("ui.events")
    Select(form_field(form, "type")).select_by_value("topic")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "main", "Exchange added.")
    status, x = http(cluster, "GET", "/api/exchanges/%2F/ui.events")
    assert status == 200 and x["type"] == "topic" and x["durable"] is True
    wait(browser, lambda b: "ui.events" in texts(b, "#exchanges td.name a"), "ui.events listed")
    go(browser, cluster, "/exchanges/%2F/ui.events")
    visible(browser, "#delete-exchange").click()
    accept_confirm(browser)
    wait(browser, lambda b: b.execute_script("return location.hash") == "#/exchanges", "back on the exchange list")
    wait(browser, lambda b: texts(b, "#exchanges td.name a") and "ui.events" not in texts(b, "#exchanges td.name a"),
         "ui.events gone")
    assert http(cluster, "GET", "/api/exchanges/%2F/ui.events")[0] == 404


def test_a_refused_change_shows_the_apis_reason(browser, cluster):
    login(browser, cluster)
    go(browser, cluster, "/policies")
    form = visible(browser, "form#add-policy")
    form_field(form, "name").send_keys("ha-bad")
    form_field(form, "pattern").send_keys("^bad$")
    form.find_element(By.CSS_SELECTOR, "a.helper[data-key='ha-mode']").click()
    form.find_elements(By.CSS_SELECTOR, ".kv tr")[0].find_element(By.CSS_SELECTOR, ".kv-value").send_keys("exactly")
    form.find_element(By.CSS_SELECTOR, "a.helper[data-key='ha-params']").click()
    form.find_elements(By.CSS_SELECTOR, ".kv tr")[1].find_element(By.CSS_SELECTOR, ".kv-value").send_keys("two")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "main", '"two" is not a number')  # the Number typed row refuses it before the API
    Select(form.find_elements(By.CSS_SELECTOR, ".kv tr")[1].find_element(By.CSS_SELECTOR, ".kv-type")).select_by_value("String")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "main", "Validation failed")
    assert http(cluster, "GET", "/api/policies/%2F/ha-bad")[0] == 404


def test_mirrored_queue_page_synchronises_on_request(browser, cluster):
    assert http(cluster, "PUT", "/api/policies/%2F/ui-manual",
                {"pattern": r"^ui\.manual$", "apply-to": "queues",
                 "definition": {"ha-mode": "all", "ha-sync-mode": "manual"}})[0] in (201, 204)
    assert http(cluster, "PUT", "/api/queues/%2F/ui.manual", {"durable": True})[0] in (201, 204)
    login(browser, cluster)
    go(browser, cluster, "/queues/%2F/ui.manual")
    wait(browser, lambda b: len(texts(b, "#mirroring tbody .mirror.synced")) == 2, "two synchronised mirrors listed")
    visible(browser, "#sync-queue").click()
    text_in(browser, "#mirroring", "Synchronisation requested.")
    status, q = http(cluster, "GET", "/api/queues/%2F/ui.manual")
    assert len(q["synchronised_slave_nodes"]) == 2


def synced_badges(browser, name: str) -> list[str] | None:
    """The blue `+N` badges in queue `name`'s row of the queue list (None: no such row yet)."""
    row = queue_row(browser, name)
    return None if row is None else [e.text for e in row.find_elements(By.CSS_SELECTOR, ".mirror.synced")]


def remove_then_add_member(browser, cluster, victim: str, what: str) -> None:
    """On a quorum queue's or a stream's page: remove `victim` from the members (`what`:
    "member" or "replica") with its row's Remove button, then add it back with the form."""
    for tr in browser.find_elements(By.CSS_SELECTOR, "#quorum tbody tr"):
        if tr.find_element(By.CSS_SELECTOR, "td").text == victim:
            tr.find_element(By.XPATH, ".//button[text()='Remove']").click()
            break
    accept_confirm(browser)
    text_in(browser, "#quorum", f"{what.capitalize()} removed.", timeout_s=60)
    wait(browser, lambda b: len(texts(b, "#quorum tbody tr")) == 2, f"two {what}s left")
    Select(browser.find_element(By.NAME, "member-node")).select_by_value(victim)
    browser.find_element(By.XPATH, f"//button[text()='Add {what}']").click()
    text_in(browser, "#quorum", f"{what.capitalize()} added.", timeout_s=60)
    wait(browser, lambda b: sorted(texts(b, "#quorum tbody tr td:nth-child(1)")) == sorted(cluster.names),
         f"three {what}s again", timeout_s=60)


def test_quorum_queue_members_are_shown_removed_and_added(browser, cluster):
    conn = amqp(cluster)
    try:
        conn.channel().queue_declare("ui.quorum", durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        conn.close()
    login(browser, cluster)
    go(browser, cluster, "/queues")

    wait(browser, lambda b: synced_badges(b, "ui.quorum") == ["+2"], "ui.quorum with +2 online members", timeout_s=60)
    assert "quorum" in queue_row(browser, "ui.quorum").text

    go(browser, cluster, "/queues/%2F/ui.quorum")
    wait(browser, lambda b: sorted(texts(b, "#quorum tbody tr td:nth-child(2)")) == ["follower", "follower", "leader"],
         "one leader and two followers", timeout_s=60)
    members = texts(browser, "#quorum tbody tr td:nth-child(1)")
    assert sorted(members) == sorted(cluster.names)
    leader = http(cluster, "GET", "/api/queues/%2F/ui.quorum")[1]["leader"]
    remove_then_add_member(browser, cluster, next(m for m in members if m != leader), "member")


def test_a_stream_is_added_through_the_form_and_its_replicas_removed_and_added(browser, cluster):
    login(browser, cluster)
    go(browser, cluster, "/queues")
    form = visible(browser, "form#add-queue")
    Select(form_field(form, "type")).select_by_value("stream")
    form_field(form, "name").send_keys("ui.stream")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "main", "Queue added.")
    status, q = http(cluster, "GET", "/api/queues/%2F/ui.stream")
    assert status == 200 and q["type"] == "stream" and q["arguments"].get("x-queue-type") == "stream"

    wait(browser, lambda b: synced_badges(b, "ui.stream") == ["+2"], "ui.stream with +2 online members", timeout_s=60)
    assert "stream" in queue_row(browser, "ui.stream").text

    go(browser, cluster, "/queues/%2F/ui.stream")
    text_in(browser, "#quorum", "Stream replicas")
    wait(browser, lambda b: sorted(texts(b, "#quorum tbody tr td:nth-child(2)")) == ["replica", "replica", "writer"],
         "one writer and two replicas", timeout_s=60)
    remove_then_add_member(browser, cluster, next(m for m in cluster.names if m != q["leader"]), "replica")


def test_users_and_permissions_through_the_admin_pages(browser, cluster):
    login(browser, cluster)
    go(browser, cluster, "/users")
    form = visible(browser, "form#add-user")
    form_field(form, "username").send_keys("ui-ops")
    form_field(form, "password").send_keys("s3cret")
    form_field(form, "password2").send_keys("s3cret")
    form.find_element(By.XPATH, ".//a[text()='Policymaker']").click()
    form.find_element(By.XPATH, ".//a[text()='Monitoring']").click()
    assert form_field(form, "tags").get_attribute("value") == "policymaker, monitoring"
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "main", "User added.")
    status, user = http(cluster, "GET", "/api/users/ui-ops")
    assert status == 200 and sorted(user["tags"]) == ["monitoring", "policymaker"]

    perm = visible(browser, "form#set-permission")
    wait(browser, lambda b: "ui-ops" in [o.text for o in Select(form_field(perm, "user")).options], "ui-ops offered")
    Select(form_field(perm, "user")).select_by_value("ui-ops")
    form_field(perm, "write").clear()
    form_field(perm, "write").send_keys("^ui\\.")
    perm.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "main", "Permission set.")
    status, p = http(cluster, "GET", "/api/permissions/%2F/ui-ops")
    assert status == 200 and (p["configure"], p["write"], p["read"]) == (".*", "^ui\\.", ".*")

    # the new user may log in: policymaker gets the Admin tab with Policies only
    login(browser, cluster, "ui-ops", "s3cret")
    go(browser, cluster, "/policies")
    visible(browser, "form#add-policy")
    assert texts(browser, ".submenu a") == ["Policies"]
    login(browser, cluster)
    go(browser, cluster, "/users")
    wait(browser, lambda b: "ui-ops" in texts(b, "#users td.name"), "ui-ops listed")
    for row in browser.find_elements(By.CSS_SELECTOR, "#users tbody tr"):
        if row.find_element(By.CSS_SELECTOR, "td.name").text == "ui-ops":
            row.find_element(By.XPATH, ".//button[text()='Delete']").click()
            break
    accept_confirm(browser)
    text_in(browser, "main", "User ui-ops deleted.")
    assert http(cluster, "GET", "/api/users/ui-ops")[0] == 404


def test_virtual_hosts_and_limits(browser, cluster):
    login(browser, cluster)
    go(browser, cluster, "/vhosts")
    form = visible(browser, "form#add-vhost")
    form_field(form, "name").send_keys("ui-vh")
    form_field(form, "description").send_keys("made in the browser")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "main", "Virtual host added.")
    wait(browser, lambda b: "ui-vh" in texts(b, "#vhosts td.name"), "ui-vh listed")

    go(browser, cluster, "/limits")
    if http(cluster, "GET", "/api/vhost-limits")[0] == 404:
        text_in(browser, "main", "does not serve virtual host limits")
    else:
        form = visible(browser, "form#set-vhost-limit")
        form_field(form, "owner").send_keys("ui-vh")
        Select(form_field(form, "limit")).select_by_value("max-queues")
        form_field(form, "value").send_keys("10")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        text_in(browser, "main", "Limit set.")
        status, limits = http(cluster, "GET", "/api/vhost-limits/ui-vh")
        assert status == 200 and limits[0]["value"] == {"max-queues": 10}
        wait(browser, lambda b: texts(b, "#vhost-limits tbody td") [:3] == ["ui-vh", "max-queues", "10"], "the limit listed")

    go(browser, cluster, "/vhosts")
    wait(browser, lambda b: "ui-vh" in texts(b, "#vhosts td.name"), "ui-vh listed")
    for row in browser.find_elements(By.CSS_SELECTOR, "#vhosts tbody tr"):
        if row.find_element(By.CSS_SELECTOR, "td.name").text == "ui-vh":
            row.find_element(By.XPATH, ".//button[text()='Delete']").click()
            break
    accept_confirm(browser)
    text_in(browser, "main", "Virtual host ui-vh deleted.")
    assert http(cluster, "GET", "/api/vhosts/ui-vh")[0] == 404


def test_queue_list_filters_and_sorts_through_the_api(browser, cluster):
    for name in ("ui.zz.last", "ui.aa.first"):
        assert http(cluster, "PUT", f"/api/queues/%2F/{name}", {"durable": False})[0] in (201, 204)
    login(browser, cluster)
    go(browser, cluster, "/queues")
    wait(browser, lambda b: "ui.aa.first" in texts(b, "#queues a.queue-link"), "the queues listed")
    browser.find_element(By.NAME, "queues-filter").send_keys(".zz.")
    wait(browser, lambda b: texts(b, "#queues a.queue-link") == ["ui.zz.last"], "only ui.zz.last matches")
    text_in(browser, ".pager-info", "1 of ")
    browser.find_element(By.NAME, "queues-filter").clear()
    browser.find_element(By.NAME, "queues-filter").send_keys(r"^ui\.(aa|zz)\.")
    browser.find_element(By.NAME, "queues-regex").click()
    wait(browser, lambda b: sorted(texts(b, "#queues a.queue-link")) == ["ui.aa.first", "ui.zz.last"], "the regex matches both")
    browser.find_element(By.CSS_SELECTOR, "#queues a.sort[data-sort=name]").click()
    wait(browser, lambda b: texts(b, "#queues a.queue-link") == ["ui.aa.first", "ui.zz.last"], "sorted by name")
    browser.find_element(By.CSS_SELECTOR, "#queues a.sort[data-sort=name]").click()
    wait(browser, lambda b: texts(b, "#queues a.queue-link") == ["ui.zz.last", "ui.aa.first"], "sorted by name, reversed")


def test_definitions_download_and_upload(browser, cluster, downloads, tmp_path):
    login(browser, cluster)
    go(browser, cluster, "/")
    visible(browser, "#export-definitions").click()
    target = downloads / "hutch-definitions.json"
    wait(browser, lambda b: target.exists() and target.stat().st_size > 0, "the definitions file downloaded")
    exported = json.loads(target.read_text())
    assert {"users", "vhosts", "permissions", "queues", "exchanges", "bindings", "policies"} <= set(exported)
    assert "guest" in [u["name"] for u in exported["users"]]

    doc = {"queues": [{"name": "ui.imported", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}]}
    upload = tmp_path / "defs.json"
    upload.write_text(json.dumps(doc))
    browser.find_element(By.CSS_SELECTOR, "input[type=file][name=file]").send_keys(str(upload))
    browser.find_element(By.ID, "import-definitions").click()
    text_in(browser, "main", "Definitions imported.")
    assert http(cluster, "GET", "/api/queues/%2F/ui.imported")[0] == 200


def test_a_policy_is_edited_and_deleted_from_the_list(browser, cluster):
    assert http(cluster, "PUT", "/api/policies/%2F/ui-edit",
                {"pattern": "^ui-edit$", "apply-to": "queues", "priority": 3, "definition": {"max-length": 5}})[0] in (201, 204)
    login(browser, cluster)
    go(browser, cluster, "/policies")
    wait(browser, lambda b: "ui-edit" in texts(b, "#policy-list td.name"), "ui-edit listed")

    def click_in_row(label: str) -> None:
        for row in browser.find_elements(By.CSS_SELECTOR, "#policy-list tbody tr"):
            if row.find_element(By.CSS_SELECTOR, "td.name").text == "ui-edit":
                row.find_element(By.XPATH, f".//button[text()='{label}']").click()
                return
        raise AssertionError("ui-edit not listed")
    click_in_row("Edit")
    form = browser.find_element(By.CSS_SELECTOR, "form#add-policy")
    assert [form_field(form, n).get_attribute("value") for n in ("name", "pattern", "apply-to", "priority")] == \
        ["ui-edit", "^ui-edit$", "queues", "3"]
    first = form.find_elements(By.CSS_SELECTOR, ".kv tr")[0]
    assert first.find_element(By.CSS_SELECTOR, ".kv-key").get_attribute("value") == "max-length"
    assert Select(first.find_element(By.CSS_SELECTOR, ".kv-type")).first_selected_option.text == "Number"
    value = first.find_element(By.CSS_SELECTOR, ".kv-value")
    value.clear()
    value.send_keys("7")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "main", "Policy set.")
    assert http(cluster, "GET", "/api/policies/%2F/ui-edit")[1]["definition"] == {"max-length": 7}

    click_in_row("Delete")
    accept_confirm(browser)
    text_in(browser, "main", "Deleted policy ui-edit.")
    assert http(cluster, "GET", "/api/policies/%2F/ui-edit")[0] == 404
    wait(browser, lambda b: "ui-edit" not in texts(b, "#policy-list td.name"), "ui-edit gone from the list")


def test_queue_page_binds_unbinds_and_purges(browser, cluster):
    assert http(cluster, "PUT", "/api/queues/%2F/ui.purge", {"durable": True})[0] in (201, 204)
    for i in range(3):
        assert http(cluster, "POST", "/api/exchanges/%2F/amq.default/publish",
                    {"routing_key": "ui.purge", "payload": f"p{i}", "payload_encoding": "string", "properties": {}})[0] == 200
    login(browser, cluster)
    go(browser, cluster, "/queues/%2F/ui.purge")
    text_in(browser, "#q-total", "3")
    bind = visible(browser, "form.bind")
    form_field(bind, "bind-other").send_keys("amq.fanout")
    bind.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(browser, lambda b: "amq.fanout" in texts(b, "#queue-bindings td a"), "bound from amq.fanout")
    status, bindings = http(cluster, "GET", "/api/queues/%2F/ui.purge/bindings")
    assert [b["source"] for b in bindings] == ["", "amq.fanout"]
    browser.find_element(By.CSS_SELECTOR, "#queue-bindings button.unbind").click()
    text_in(browser, "main", "Binding removed.")
    wait(browser, lambda b: "amq.fanout" not in texts(b, "#queue-bindings td a"), "amq.fanout binding gone")
    assert [b["source"] for b in http(cluster, "GET", "/api/queues/%2F/ui.purge/bindings")[1]] == [""]

    visible(browser, "#purge-queue").click()
    accept_confirm(browser)
    text_in(browser, "main", "Queue purged.")
    text_in(browser, "#q-total", "0")
    assert http(cluster, "GET", "/api/queues/%2F/ui.purge")[1]["messages"] == 0


def test_operator_policy_form(browser, cluster):
    login(browser, cluster)
    go(browser, cluster, "/policies")
    form = visible(browser, "form#add-operator-policy")
    form_field(form, "name").send_keys("ui-cap")
    form_field(form, "pattern").send_keys("^ui\\.cap")
    form.find_element(By.CSS_SELECTOR, "a.helper[data-key='max-length']").click()
    form.find_elements(By.CSS_SELECTOR, ".kv tr")[0].find_element(By.CSS_SELECTOR, ".kv-value").send_keys("100")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    text_in(browser, "main", "Operator policy set.")
    status, p = http(cluster, "GET", "/api/operator-policies/%2F/ui-cap")
    assert status == 200 and p["definition"] == {"max-length": 100} and p["pattern"] == "^ui\\.cap"
    wait(browser, lambda b: "ui-cap" in texts(b, "#operator-policy-list td.name"), "ui-cap listed")


def test_a_stopped_node_is_shown_not_running(browser, cluster):
    """Last in the module: it stops a node of the shared cluster."""
    login(browser, cluster)
    go(browser, cluster, "/")
    wait(browser, lambda b: texts(b, "#nodes tbody tr td:nth-child(8)") == ["running"] * 3, "three running nodes")
    cluster.stop(2)
    down = cluster.names[2]

    def shown_down(b) -> bool:
        rows = b.execute_script("return [...document.querySelectorAll('#nodes tbody tr')]"
                                ".map(r => [r.cells[0].textContent, r.cells[7].textContent])")
        return sorted(rows) == sorted([[n, "running"] for n in cluster.names[:2]] + [[down, "not running"]])
    wait(browser, shown_down, f"{down} shown as not running", timeout_s=60)
    colour = browser.execute_script("return getComputedStyle(document.querySelector('#nodes .status.red')).color")
    assert colour == "rgb(192, 57, 43)"  # --red
