"""The web console in a real browser: Debian's chromium, headless, driven by selenium through chromium-driver (`make
compat-deps` installs both), against a file-store `mqk serve` (the key index is the file engine's).

What a user would check by eye is asserted on the DOM: a topic created by confluent-kafka is listed with its
partitions; a message produced by kafka-python shows its value and headers, its markup inert (no element made from
it); a consumer group's lag falls, on the page as it refreshes itself, while a confluent-kafka consumer catches up;
the message browser's key search finds a message through the key index, and a RocketMQ message (mqk's own
remoting client) found by its KEYS shows its properties. Also the overview's health and live charts, the timer's
pending messages, and, on a broker started with --admin-console-writes, the forms that create a topic and reset a
group's offsets (refused while a consumer is a member). Each step saves a screenshot in the
test's tmp dir, checks it is a non-empty PNG and prints its path (run with -s to see them).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_helpers import SESSION_TIMEOUT_MS, unique
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from mqk.client import Message
from mqk.client import Producer as NativeProducer
from mqk.testing import BrokerProcess

EVIL = "<img src=x onerror=document.title='pwned'> & <b>bold</b>"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WAIT_S = 30


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("console") / "data", storage="file").start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    assert chromium and driver_path, "chromium and chromium-driver are not installed (make compat-deps installs them)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()


def console_url(broker: BrokerProcess, hash_: str) -> str:
    assert broker.admin_address is not None
    host, port = broker.admin_address
    return f"http://{host}:{port}/console/#{hash_}"


def wait_for(driver: WebDriver, condition: Any, what: str) -> Any:
    """Until `condition(driver)` is truthy (asked again when it met an element the page had just redrawn)."""
    wait = WebDriverWait(driver, WAIT_S, ignored_exceptions=(StaleElementReferenceException,))
    return wait.until(condition, f"the console did not show {what}")


def cells_of(driver: WebDriver, rows_css: str) -> list[list[str]]:
    """The cell texts of each table row `rows_css` matches, read in one script: the page redraws its tables as it
    refreshes itself, and elements found one lookup at a time may be gone by the next (stale element)."""
    script = (
        "return Array.from(document.querySelectorAll(arguments[0])).map(r => Array.from(r.cells).map(c => c.innerText))"
    )
    return list(driver.execute_script(script, rows_css))


def screenshot(driver: WebDriver, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(path))
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC), f"{path} is not a PNG screenshot"
    print(f"console screenshot: {path}")
    return path


def create_topic(bootstrap: str, name: str, partitions: int, configs: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=configs or {})]).values():
        future.result(timeout=20)


def test_the_console_lists_a_topic_created_by_confluent_kafka(broker, browser, tmp_path):
    topic = unique("console-topic")
    create_topic(broker.bootstrap, topic, 3, {"retention.ms": "3600000"})
    browser.get(console_url(broker, "topics"))
    (cells,) = wait_for(browser, lambda d: cells_of(d, f'tr.topic[data-topic="{topic}"]'), f"topic {topic}")
    assert cells[0] == topic and cells[1] == "3" and "retention.ms=3600000" in cells[5]
    browser.find_element(By.CSS_SELECTOR, f'tr.topic[data-topic="{topic}"] a').click()
    wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr.partition")) == 3, "three partitions")
    assert browser.find_element(By.ID, "topic-name").text == f"Topic {topic}"
    configs = {row[0]: row[1] for row in cells_of(browser, "#configs-table tbody tr")}
    assert configs["retention.ms"] == "3600000"
    screenshot(browser, tmp_path, "topic")


def test_the_console_shows_a_kafka_python_message_with_its_headers(broker, browser, tmp_path):
    topic = unique("console-headers")
    create_topic(broker.bootstrap, topic, 1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    producer.send(topic, key=b"plain", value=b"first")
    headers = [("trace-id", b"abc-123"), ("source<", EVIL.encode())]
    producer.send(topic, key=b"order-1", value=EVIL.encode(), headers=headers).get(timeout=20)
    producer.close()
    browser.get(console_url(broker, f"messages?topic={topic}&partition=0&offset=1"))
    row = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.message"), "the message")[0]
    assert row.get_attribute("data-offset") == "1"
    assert row.find_element(By.CSS_SELECTOR, "td.value").text == EVIL
    assert row.find_element(By.CSS_SELECTOR, "td.key").text == "order-1"
    shown = [li.text for li in row.find_elements(By.CSS_SELECTOR, "li.header")]
    assert shown == ["trace-id: abc-123", f"source<: {EVIL}"]
    # the markup in the value and the header is text on the page: no element was made from it, nothing ran
    assert browser.find_elements(By.CSS_SELECTOR, "#view img, #view pre *") == []
    assert browser.title == "mqk console"
    screenshot(browser, tmp_path, "message")


def test_a_groups_lag_falls_on_the_page_as_its_consumer_catches_up(broker, browser, tmp_path):
    topic, group = unique("console-lag"), unique("console-group")
    create_topic(broker.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(30):
        producer.produce(topic, value=b"m%d" % i, partition=0)
    assert producer.flush(20) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
        }
    )
    try:
        consumer.subscribe([topic])
        consume_and_commit(consumer, 10)
        browser.get(console_url(broker, f"group?id={group}"))
        wait_for(browser, lambda d: lag_shown(d) == "20", "a lag of 20")
        assert browser.find_elements(By.CSS_SELECTOR, "tr.member"), "the live consumer is listed as a member"
        screenshot(browser, tmp_path, "lag-20")
        consume_and_commit(consumer, 10)
        # the page refreshes itself: no reload, the same document shows the new lag
        wait_for(browser, lambda d: lag_shown(d) == "10", "the lag falling to 10")
        consume_and_commit(consumer, 10)
        wait_for(browser, lambda d: lag_shown(d) == "0", "the lag falling to 0")
        assert cells_of(browser, "tr.offset") == [[topic, "0", "30", "30", "0"]]
        screenshot(browser, tmp_path, "lag-0")
    finally:
        consumer.close()


def lag_shown(driver: WebDriver) -> str | None:
    found = driver.find_elements(By.ID, "group-lag")
    return found[0].text if found else None


def consume_and_commit(consumer: Consumer, count: int) -> None:
    got: list[Any] = []
    for _ in range(200):
        if len(got) >= count:
            break
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg)
    assert len(got) == count, f"consumed {len(got)} of {count}"
    last = got[-1]
    consumer.commit(offsets=[TopicPartition(last.topic(), last.partition(), last.offset() + 1)], asynchronous=False)


def test_the_console_finds_a_message_by_key(broker, browser, tmp_path):
    topic = unique("console-keys")
    create_topic(broker.bootstrap, topic, 4, {"index.keys": "true"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for i in range(40):
        producer.send(topic, key=b"customer-%d" % (i % 8), value=b"order %d" % i)
    producer.flush(20)
    producer.close()
    browser.get(console_url(broker, "messages"))
    form = wait_for(browser, lambda d: d.find_elements(By.ID, "message-query"), "the message form")[0]
    form.find_element(By.NAME, "topic").send_keys(topic)
    form.find_element(By.NAME, "key").send_keys("customer-3")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    rows = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.message"), "the messages of customer-3")
    assert browser.find_element(By.ID, "message-summary").text == "by key: 5 found"
    values = sorted(r.find_element(By.CSS_SELECTOR, "td.value").text for r in rows)
    assert values == sorted(f"order {i}" for i in range(3, 40, 8))
    assert {r.find_element(By.CSS_SELECTOR, "td.key").text for r in rows} == {"customer-3"}
    screenshot(browser, tmp_path, "by-key")


def test_the_overview_shows_health_and_live_charts(broker, browser, tmp_path):
    browser.get(console_url(broker, "overview"))
    wait_for(browser, lambda d: d.find_element(By.ID, "health").text == "ready", "the broker as ready")
    charts = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "figure.chart"), "the charts")
    assert len(charts) == 8
    # the charts draw the polled figures: after a few polls the lines have several points
    wait_for(
        browser,
        lambda d: (
            len((d.find_element(By.CSS_SELECTOR, "#chart-log polyline").get_attribute("points") or "").split()) >= 3
        ),
        "a chart line of three points",
    )
    checks = {row[0]: row[1] for row in cells_of(browser, "#health-checks tbody tr")}
    assert checks == {"listeners": "true", "recovery": "true", "store_writable": "true"}
    screenshot(browser, tmp_path, "overview")


def test_the_console_lists_delayed_messages_pending(broker, browser, tmp_path):
    topic = unique("console-delayed")
    create_topic(broker.bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce(topic, value=b"later", key=b"d-1", partition=1, headers=[("mqk-delay-ms", b"3600000")])
    assert producer.flush(20) == 0
    browser.get(console_url(broker, "delayed"))
    cells = wait_for(
        browser, lambda d: [row for row in cells_of(d, "tr.delayed") if topic in row], "the delayed message"
    )[0]
    assert cells[1:4] == [topic, "1", "d-1"] and "in 3" in cells[0]  # due in about 3600 s
    assert int(browser.find_element(By.ID, "delayed-pending").text) >= 1
    screenshot(browser, tmp_path, "delayed")


@pytest.fixture(scope="module")
def writable_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("console-writes") / "data"
    proc = BrokerProcess(data, storage="file", extra_args=["--admin-console-writes"]).start()
    yield proc
    proc.stop()


def test_with_writes_on_the_console_creates_a_topic_and_resets_only_an_idle_group(writable_broker, browser, tmp_path):
    broker = writable_broker
    topic, group = unique("console-made"), unique("console-reset")
    browser.get(console_url(broker, "topics"))
    form = wait_for(browser, lambda d: d.find_elements(By.ID, "create-topic"), "the create form")[0]
    form.find_element(By.NAME, "name").send_keys(topic)
    partitions = form.find_element(By.NAME, "partitions")
    partitions.clear()
    partitions.send_keys("2")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "create-status").text == f"created {topic}", "the creation")
    (cells,) = wait_for(browser, lambda d: cells_of(d, f'tr.topic[data-topic="{topic}"]'), "the new topic")
    assert cells[1] == "2"
    screenshot(browser, tmp_path, "created")

    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(6):
        producer.produce(topic, value=b"r%d" % i, partition=0)
    assert producer.flush(20) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
        }
    )
    consumer.subscribe([topic])
    consume_and_commit(consumer, 6)
    browser.get(console_url(broker, f"group?id={group}"))
    wait_for(browser, lambda d: lag_shown(d) == "0", "the caught-up group")
    reset = wait_for(browser, lambda d: d.find_elements(By.ID, "reset-offsets"), "the reset form")[0]
    reset.find_element(By.CSS_SELECTOR, "button[type=submit]").click()  # to earliest, the first choice
    status = wait_for(browser, lambda d: d.find_element(By.ID, "reset-status").text, "the reset's answer")
    assert "stop its consumers" in status  # refused while the consumer is a member, as Kafka does
    assert lag_shown(browser) == "0"
    consumer.close()  # leaves the group: it is empty now
    wait_for(browser, lambda d: d.find_element(By.ID, "group-state").text == "Empty", "the group empty")
    reset.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "reset-status").text == "reset", "the reset done")
    wait_for(browser, lambda d: lag_shown(d) == "6", "the lag back to 6")
    screenshot(browser, tmp_path, "reset")


def test_a_rocketmq_message_found_by_its_keys_shows_its_properties(broker, browser, tmp_path):
    topic = unique("console-rocketmq")
    create_topic(broker.bootstrap, topic, 1)
    assert broker.namesrv_address is not None
    namesrv = "{}:{}".format(*broker.namesrv_address)

    async def send() -> None:
        async with NativeProducer(namesrv, group=unique("console-prod")) as producer:
            await producer.send(
                Message(topic, b"from rocketmq", tags="TagA", keys=["rk-1", "rk-2"], properties={"a<": "b>"})
            )

    asyncio.run(send())
    browser.get(console_url(broker, f"messages?topic={topic}&key=rk-2"))
    row = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.message"), "the RocketMQ message")[0]
    assert row.find_element(By.CSS_SELECTOR, "td.value").text == "from rocketmq"
    props = {}
    for li in row.find_elements(By.CSS_SELECTOR, "td.rocketmq li"):
        name, _, value = li.text.partition(": ")
        props[name] = value
    assert props["TAGS"] == "TagA" and props["KEYS"] == "rk-1 rk-2" and props["a<"] == "b>"
    assert props.get("UNIQ_KEY"), "the producer's message id is a property"
    screenshot(browser, tmp_path, "rocketmq")
