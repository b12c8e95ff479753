"""The kubelet's gRPC APIs as generated from upstream's .proto files (`_proto`: the
device-plugin API v1beta1 and PodResources v1), shared by the adapters that speak them
(adapters.deviceplugin, adapters.podresources) and the testing kit's kubelet stand-in."""
