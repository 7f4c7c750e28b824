set terminal pngcairo size 1400,650 font ',10'
set output '/work/main/bench/results/2026-12-03/soak_2x2.png'
set title 'Soak 2x2: step vs time, one fault per ~minute (14 faults)'
set xlabel 'seconds since kubectl apply'
set ylabel 'step'
set key left top
set grid
set yrange [0:3472]
set arrow from 56.7, graph 0 to 56.7, graph 1 nohead lc rgb '#d62728' lw 1.2 dt 2
set label 'kill r0' at 58.7, graph 0.62 rotate by 90 tc rgb '#d62728' font ',8'
set arrow from 127.8, graph 0 to 127.8, graph 1 nohead lc rgb '#ff7f0e' lw 1.2 dt 2
set label 'stop r2' at 129.8, graph 0.72 rotate by 90 tc rgb '#ff7f0e' font ',8'
set arrow from 173.8, graph 0 to 173.8, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 175.8, graph 0.82 rotate by 90 tc rgb '#2ca02c' font ',8'
set arrow from 225.3, graph 0 to 225.3, graph 1 nohead lc rgb '#9467bd' lw 1.2 dt 2
set label 'delete r0' at 227.3, graph 0.62 rotate by 90 tc rgb '#9467bd' font ',8'
set arrow from 287.9, graph 0 to 287.9, graph 1 nohead lc rgb '#1f77b4' lw 1.2 dt 2
set label 'standin' at 289.9, graph 0.72 rotate by 90 tc rgb '#1f77b4' font ',8'
set arrow from 358.6, graph 0 to 358.6, graph 1 nohead lc rgb '#ff7f0e' lw 1.2 dt 2
set label 'stop r3' at 360.6, graph 0.82 rotate by 90 tc rgb '#ff7f0e' font ',8'
set arrow from 419.7, graph 0 to 419.7, graph 1 nohead lc rgb '#9467bd' lw 1.2 dt 2
set label 'delete r0' at 421.7, graph 0.62 rotate by 90 tc rgb '#9467bd' font ',8'
set arrow from 482.9, graph 0 to 482.9, graph 1 nohead lc rgb '#d62728' lw 1.2 dt 2
set label 'kill r2' at 484.9, graph 0.72 rotate by 90 tc rgb '#d62728' font ',8'
set arrow from 540.5, graph 0 to 540.5, graph 1 nohead lc rgb '#1f77b4' lw 1.2 dt 2
set label 'standin' at 542.5, graph 0.82 rotate by 90 tc rgb '#1f77b4' font ',8'
set arrow from 595.1, graph 0 to 595.1, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 597.1, graph 0.62 rotate by 90 tc rgb '#2ca02c' font ',8'
set arrow from 655.8, graph 0 to 655.8, graph 1 nohead lc rgb '#d62728' lw 1.2 dt 2
set label 'kill r1' at 657.8, graph 0.72 rotate by 90 tc rgb '#d62728' font ',8'
set arrow from 722.9, graph 0 to 722.9, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 724.9, graph 0.82 rotate by 90 tc rgb '#2ca02c' font ',8'
set arrow from 789.5, graph 0 to 789.5, graph 1 nohead lc rgb '#9467bd' lw 1.2 dt 2
set label 'delete r0' at 791.5, graph 0.62 rotate by 90 tc rgb '#9467bd' font ',8'
set arrow from 859.5, graph 0 to 859.5, graph 1 nohead lc rgb '#1f77b4' lw 1.2 dt 2
set label 'standin' at 861.5, graph 0.72 rotate by 90 tc rgb '#1f77b4' font ',8'
plot '/work/main/bench/results/2026-12-03/soak_2x2_rows.dat' using 1:2 with points pt 7 ps 0.2 lc rgb '#bbbbbb' title 'logged steps (all ranks, incl. redone)', '/work/main/bench/results/2026-12-03/soak_2x2_kept.dat' using 1:2 with lines lw 2 lc rgb 'black' title 'kept steps (soak)', '/work/main/bench/results/2026-12-03/soak_2x2_base.dat' using 1:2 with lines lw 1.5 dt 3 lc rgb '#555555' title 'undisturbed run'
