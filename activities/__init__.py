"""Every side effect on Kubernetes, as Temporal activities: `KubeActivities(kube).all()` registers them."""

from activities.kube_activities import KubeActivities

__all__ = ["KubeActivities"]
