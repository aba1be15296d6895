"""What a user hits with Kafka, said as a reason with what to do (pure).

Owns `KafkaProblem` (the kinds: the broker cannot be reached, a topic is missing or was
deleted, the broker refused the security settings, a security setting the client does not
take) and two readings of a failure: `problem_of_text`, the kind a failure's words show (Spark's
Java client, librdkafka's and Spark's own data-loss checks each say them their own way), and
`explain`, the reason a task's status message carries: the kind's advice first, then the error
that said it (`common.failures.innermost_error`'s form, bounded). A failure that shows none of
them is left to `innermost_error`. Does not own finding out (`executor.kafka_io.check_source`
asks the broker at a task's start) nor what the scheduler does with a failure (every Kafka
problem is retried from the checkpoint, as any "retry" failure: a broker comes back, a topic is
created, a security file is fixed, and nothing Kafka holds is lost meanwhile).
"""

from __future__ import annotations

import re
from typing import Literal

from common.failures import MAX_REASON

KafkaProblem = Literal["unreachable", "no-topic", "refused", "bad-setting"]

ADVICE: dict[KafkaProblem, str] = {
    "unreachable": "cannot reach the Kafka broker{where}: is it running (`elastiq kafka "
                   "status`) and is bootstrap= right?",
    "no-topic": "a Kafka topic{where} does not exist or was deleted: create it (`elastiq kafka "
                "produce` or kafka-topics.sh) or fix topics=; the task resumes from its "
                "checkpoint once it is there",
    "refused": "the Kafka broker{where} refused the connection's security settings (wrong "
               "credentials, or SSL/SASL where the listener takes another protocol): fix the "
               "file given as security-file=",
    "bad-setting": "a setting of the security file{where} is not one the Kafka client takes: "
                   "fix the file given as security-file=",
}

# The words of each problem, in the order they are tried (the first that matches decides: an
# authentication failure often comes with a disconnect, a deleted topic with a timeout).
_WORDS: tuple[tuple[KafkaProblem, re.Pattern[str]], ...] = (
    ("bad-setting", re.compile(
        r"Invalid value .* for configuration property|No such configuration property|"
        r"ConfigException", re.IGNORECASE)),
    ("refused", re.compile(
        r"SaslAuthenticationException|SslAuthenticationException|AuthenticationException|"
        r"Authentication failed|SSL handshake failed|_AUTHENTICATION|SASL authentication|"
        r"SSL alert number|alert bad certificate|alert certificate required|"
        r"TopicAuthorizationException|TOPIC_AUTHORIZATION_FAILED|IllegalSaslState|"
        r"UnsupportedSaslMechanism", re.IGNORECASE)),
    ("no-topic", re.compile(
        r"UnknownTopicOrPartitionException|UNKNOWN_TOPIC_OR_PART|UNKNOWN_TOPIC|"
        r"does not host this topic-partition|KAFKA_DATA_LOSS\.PARTITIONS?_(DELETED|LOST)|"
        r"partitions? .* (are|is) gone|Unknown topic", re.IGNORECASE)),
    ("unreachable", re.compile(
        r"Timed out waiting for a node assignment|Timed out waiting to send the call|"
        r"Timed out waiting for a node|_TRANSPORT|_ALL_BROKERS_DOWN|all brokers are down|"
        r"Connection refused|could not be established\. (Node|Broker) may not be available|"
        r"Failed to resolve|_RESOLVE|Bootstrap broker .* disconnected", re.IGNORECASE)),
)

_EVIDENCE = 200  # characters of the error that showed the problem


def problem_of_text(text: str) -> KafkaProblem | None:
    """The Kafka problem a failure's text shows, or None (pure)."""
    for problem, words in _WORDS:
        if words.search(text):
            return problem
    return None


def advice(problem: KafkaProblem, where: str = "") -> str:
    """What the problem is and what to do; `where` names the broker or topic ("" if unknown)."""
    return ADVICE[problem].format(where=f" {where}" if where else "")


def explain(text: str, inner: str | None) -> str | None:
    """The reason for a failure whose text shows a Kafka problem: the advice, then the error
    (`inner`, the innermost error of the text, else the first line that matched), bounded to
    `MAX_REASON`; None when no Kafka problem shows."""
    problem = problem_of_text(text)
    if problem is None:
        return None
    evidence = inner or _matching_line(text, problem)
    reason = f"{advice(problem)} ({evidence[:_EVIDENCE]})" if evidence else advice(problem)
    return reason[:MAX_REASON]


def _matching_line(text: str, problem: KafkaProblem) -> str:
    words = dict(_WORDS)[problem]
    for line in text.splitlines():
        if words.search(line):
            return line.strip()
    return ""
