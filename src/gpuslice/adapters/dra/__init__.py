"""The DRA kubelet plugin's adapters: its gRPC sockets (registration, DRA v1 and v1beta1,
DRAResourceHealth), the checkpoint of prepared claims and the per-claim CDI spec files."""
