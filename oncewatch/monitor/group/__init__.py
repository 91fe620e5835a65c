"""Several monitor instances acting as one (issue 18): routers repartition the sources by key onto oncewatch's
own topic, judges consume it as one Kafka consumer group, each partition a shard of checks.shards.

- wire: what travels on the internal topic (a shard's part of a transaction, an event, a clock mark).
- routing: the routers, reading the sources and writing the internal topic.
- judging: the judges, one engine per internal partition owned, committed to the shared store with its offset.
"""
