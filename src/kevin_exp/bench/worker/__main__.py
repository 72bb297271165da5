from kevin_exp.bench.worker.entry import main

main()
