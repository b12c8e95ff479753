from gpuslice.entry import main

main()
