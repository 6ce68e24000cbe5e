# w0 keeps calling w1 and w2 for 1 s while w1 and w2 are partitioned from
# each other for 500 ms (tools/workloads/partition_1_2.plan). w1 also relays
# through w2, so its relays fail or wait while the partition holds.
workers 3
call 0 1,2 add rate=200 for=1s start=5ms timeout=50ms expect=ok
call 1 2 relay count=50 every=20ms start=5ms delay=1ms timeout=100ms
call 2 1 echo count=20 every=50ms start=5ms payload=4096 timeout=inf
