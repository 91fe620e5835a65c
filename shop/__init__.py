"""The simulated payment shop that oncewatch watches: traffic, injected faults, ground truth.

    from oncewatch import shop
    truth = shop.run(shop.ShopSettings(seed=7, orders=3000, rate=60, faults="all", reset=True))
    truth.fault_for("F1", {"trade_no": "..."})
"""

from oncewatch.shop.runner import ShopError, run
from oncewatch.shop.settings import KafkaTarget, MySQLTarget, ShopSettings
from oncewatch.shop.truth import Fault, GroundTruth

__all__ = ["run", "ShopSettings", "MySQLTarget", "KafkaTarget", "GroundTruth", "Fault", "ShopError"]
