set terminal pngcairo size 1260,680 font 'sans,9'
modes = 'ddp localsgd diloco edit a-edit'
set output '/work/main/bench/results/2026-12-02/loss_tokens_2x2.png'
set multiplot layout 2,3 title 'training loss vs job tokens, layout 2x2'
set xlabel 'job tokens'
set ylabel 'train loss (mean of replicas, last 5 steps)'
set key top right
set grid
set title 'normal'
plot '/work/main/bench/results/2026-12-02/data/2x2_normal_ddp.dat' using 2:3 with lines lw 1.5 title 'ddp', '/work/main/bench/results/2026-12-02/data/2x2_normal_localsgd.dat' using 2:3 with lines lw 1.5 title 'localsgd', '/work/main/bench/results/2026-12-02/data/2x2_normal_diloco.dat' using 2:3 with lines lw 1.5 title 'diloco', '/work/main/bench/results/2026-12-02/data/2x2_normal_edit.dat' using 2:3 with lines lw 1.5 title 'edit', '/work/main/bench/results/2026-12-02/data/2x2_normal_a-edit.dat' using 2:3 with lines lw 1.5 title 'a-edit'
set title 'straggler'
plot '/work/main/bench/results/2026-12-02/data/2x2_straggler_ddp.dat' using 2:3 with lines lw 1.5 title 'ddp', '/work/main/bench/results/2026-12-02/data/2x2_straggler_localsgd.dat' using 2:3 with lines lw 1.5 title 'localsgd', '/work/main/bench/results/2026-12-02/data/2x2_straggler_diloco.dat' using 2:3 with lines lw 1.5 title 'diloco', '/work/main/bench/results/2026-12-02/data/2x2_straggler_edit.dat' using 2:3 with lines lw 1.5 title 'edit', '/work/main/bench/results/2026-12-02/data/2x2_straggler_a-edit.dat' using 2:3 with lines lw 1.5 title 'a-edit'
set title 'random'
plot '/work/main/bench/results/2026-12-02/data/2x2_random_ddp.dat' using 2:3 with lines lw 1.5 title 'ddp', '/work/main/bench/results/2026-12-02/data/2x2_random_localsgd.dat' using 2:3 with lines lw 1.5 title 'localsgd', '/work/main/bench/results/2026-12-02/data/2x2_random_diloco.dat' using 2:3 with lines lw 1.5 title 'diloco', '/work/main/bench/results/2026-12-02/data/2x2_random_edit.dat' using 2:3 with lines lw 1.5 title 'edit', '/work/main/bench/results/2026-12-02/data/2x2_random_a-edit.dat' using 2:3 with lines lw 1.5 title 'a-edit'
set title 'link100'
plot '/work/main/bench/results/2026-12-02/data/2x2_link100_ddp.dat' using 2:3 with lines lw 1.5 title 'ddp', '/work/main/bench/results/2026-12-02/data/2x2_link100_localsgd.dat' using 2:3 with lines lw 1.5 title 'localsgd', '/work/main/bench/results/2026-12-02/data/2x2_link100_diloco.dat' using 2:3 with lines lw 1.5 title 'diloco', '/work/main/bench/results/2026-12-02/data/2x2_link100_edit.dat' using 2:3 with lines lw 1.5 title 'edit', '/work/main/bench/results/2026-12-02/data/2x2_link100_a-edit.dat' using 2:3 with lines lw 1.5 title 'a-edit'
set title 'link20'
plot '/work/main/bench/results/2026-12-02/data/2x2_link20_ddp.dat' using 2:3 with lines lw 1.5 title 'ddp', '/work/main/bench/results/2026-12-02/data/2x2_link20_localsgd.dat' using 2:3 with lines lw 1.5 title 'localsgd', '/work/main/bench/results/2026-12-02/data/2x2_link20_diloco.dat' using 2:3 with lines lw 1.5 title 'diloco', '/work/main/bench/results/2026-12-02/data/2x2_link20_edit.dat' using 2:3 with lines lw 1.5 title 'edit', '/work/main/bench/results/2026-12-02/data/2x2_link20_a-edit.dat' using 2:3 with lines lw 1.5 title 'a-edit'
unset multiplot
set output '/work/main/bench/results/2026-12-02/loss_time_2x2.png'
set multiplot layout 2,3 title 'training loss vs wall time (s), layout 2x2'
set xlabel 'wall time (s)'
set ylabel 'train loss (mean of replicas, last 5 steps)'
set key top right
set grid
set title 'normal'
plot '/work/main/bench/results/2026-12-02/data/2x2_normal_ddp.dat' using 1:3 with lines lw 1.5 title 'ddp', '/work/main/bench/results/2026-12-02/data/2x2_normal_localsgd.dat' using 1:3 with lines lw 1.5 title 'localsgd', '/work/main/bench/results/2026-12-02/data/2x2_normal_diloco.dat' using 1:3 with lines lw 1.5 title 'diloco', '/work/main/bench/results/2026-12-02/data/2x2_normal_edit.dat' using 1:3 with lines lw 1.5 title 'edit', '/work/main/bench/results/2026-12-02/data/2x2_normal_a-edit.dat' using 1:3 with lines lw 1.5 title 'a-edit'
set title 'straggler'
plot '/work/main/bench/results/2026-12-02/data/2x2_straggler_ddp.dat' using 1:3 with lines lw 1.5 title 'ddp', '/work/main/bench/results/2026-12-02/data/2x2_straggler_localsgd.dat' using 1:3 with lines lw 1.5 title 'localsgd', '/work/main/bench/results/2026-12-02/data/2x2_straggler_diloco.dat' using 1:3 with lines lw 1.5 title 'diloco', '/work/main/bench/results/2026-12-02/data/2x2_straggler_edit.dat' using 1:3 with lines lw 1.5 title 'edit', '/work/main/bench/results/2026-12-02/data/2x2_straggler_a-edit.dat' using 1:3 with lines lw 1.5 title 'a-edit'
set title 'random'
plot '/work/main/bench/results/2026-12-02/data/2x2_random_ddp.dat' using 1:3 with lines lw 1.5 title 'ddp', '/work/main/bench/results/2026-12-02/data/2x2_random_localsgd.dat' using 1:3 with lines lw 1.5 title 'localsgd', '/work/main/bench/results/2026-12-02/data/2x2_random_diloco.dat' using 1:3 with lines lw 1.5 title 'diloco', '/work/main/bench/results/2026-12-02/data/2x2_random_edit.dat' using 1:3 with lines lw 1.5 title 'edit', '/work/main/bench/results/2026-12-02/data/2x2_random_a-edit.dat' using 1:3 with lines lw 1.5 title 'a-edit'
set title 'link100'
plot '/work/main/bench/results/2026-12-02/data/2x2_link100_ddp.dat' using 1:3 with lines lw 1.5 title 'ddp', '/work/main/bench/results/2026-12-02/data/2x2_link100_localsgd.dat' using 1:3 with lines lw 1.5 title 'localsgd', '/work/main/bench/results/2026-12-02/data/2x2_link100_diloco.dat' using 1:3 with lines lw 1.5 title 'diloco', '/work/main/bench/results/2026-12-02/data/2x2_link100_edit.dat' using 1:3 with lines lw 1.5 title 'edit', '/work/main/bench/results/2026-12-02/data/2x2_link100_a-edit.dat' using 1:3 with lines lw 1.5 title 'a-edit'
set title 'link20'
plot '/work/main/bench/results/2026-12-02/data/2x2_link20_ddp.dat' using 1:3 with lines lw 1.5 title 'ddp', '/work/main/bench/results/2026-12-02/data/2x2_link20_localsgd.dat' using 1:3 with lines lw 1.5 title 'localsgd', '/work/main/bench/results/2026-12-02/data/2x2_link20_diloco.dat' using 1:3 with lines lw 1.5 title 'diloco', '/work/main/bench/results/2026-12-02/data/2x2_link20_edit.dat' using 1:3 with lines lw 1.5 title 'edit', '/work/main/bench/results/2026-12-02/data/2x2_link20_a-edit.dat' using 1:3 with lines lw 1.5 title 'a-edit'
unset multiplot
set terminal pngcairo size 900,420 font 'sans,9'
set output '/work/main/bench/results/2026-12-02/tps_2x2.png'
set title 'steady tokens/s (after warm-up), layout 2x2'
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set ylabel 'tokens/s'
set xlabel ''
set key top right
set grid ytics
set yrange [0:*]
plot for [i=2:6] '/work/main/bench/results/2026-12-02/data/tps_2x2.dat' using i:xtic(1) title columnheader(i)
