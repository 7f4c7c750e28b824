set terminal pngcairo size 1400,650 font ',10'
set output '/work/main/bench/results/2026-12-03/soak_4x1.png'
set title 'Soak 4x1: step vs time, one fault per ~minute (14 faults)'
set xlabel 'seconds since kubectl apply'
set ylabel 'step'
set key left top
set grid
set yrange [0:3643]
set arrow from 58.1, graph 0 to 58.1, graph 1 nohead lc rgb '#1f77b4' lw 1.2 dt 2
set label 'standin' at 60.1, graph 0.62 rotate by 90 tc rgb '#1f77b4' font ',8'
set arrow from 125.3, graph 0 to 125.3, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 127.3, graph 0.72 rotate by 90 tc rgb '#2ca02c' font ',8'
set arrow from 187.5, graph 0 to 187.5, graph 1 nohead lc rgb '#ff7f0e' lw 1.2 dt 2
set label 'stop r3' at 189.5, graph 0.82 rotate by 90 tc rgb '#ff7f0e' font ',8'
set arrow from 241.0, graph 0 to 241.0, graph 1 nohead lc rgb '#9467bd' lw 1.2 dt 2
set label 'delete r0' at 243.0, graph 0.62 rotate by 90 tc rgb '#9467bd' font ',8'
set arrow from 316.2, graph 0 to 316.2, graph 1 nohead lc rgb '#d62728' lw 1.2 dt 2
set label 'kill r3' at 318.2, graph 0.72 rotate by 90 tc rgb '#d62728' font ',8'
set arrow from 380.2, graph 0 to 380.2, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 382.2, graph 0.82 rotate by 90 tc rgb '#2ca02c' font ',8'
set arrow from 445.6, graph 0 to 445.6, graph 1 nohead lc rgb '#d62728' lw 1.2 dt 2
set label 'kill r0' at 447.6, graph 0.62 rotate by 90 tc rgb '#d62728' font ',8'
set arrow from 516.1, graph 0 to 516.1, graph 1 nohead lc rgb '#ff7f0e' lw 1.2 dt 2
set label 'stop r0' at 518.1, graph 0.72 rotate by 90 tc rgb '#ff7f0e' font ',8'
set arrow from 564.1, graph 0 to 564.1, graph 1 nohead lc rgb '#1f77b4' lw 1.2 dt 2
set label 'standin' at 566.1, graph 0.82 rotate by 90 tc rgb '#1f77b4' font ',8'
set arrow from 633.3, graph 0 to 633.3, graph 1 nohead lc rgb '#9467bd' lw 1.2 dt 2
set label 'delete r1' at 635.3, graph 0.62 rotate by 90 tc rgb '#9467bd' font ',8'
set arrow from 685.5, graph 0 to 685.5, graph 1 nohead lc rgb '#ff7f0e' lw 1.2 dt 2
set label 'stop r3' at 687.5, graph 0.72 rotate by 90 tc rgb '#ff7f0e' font ',8'
set arrow from 742.1, graph 0 to 742.1, graph 1 nohead lc rgb '#9467bd' lw 1.2 dt 2
set label 'delete r2' at 744.1, graph 0.82 rotate by 90 tc rgb '#9467bd' font ',8'
set arrow from 802.3, graph 0 to 802.3, graph 1 nohead lc rgb '#d62728' lw 1.2 dt 2
set label 'kill r3' at 804.3, graph 0.62 rotate by 90 tc rgb '#d62728' font ',8'
set arrow from 861.3, graph 0 to 861.3, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 863.3, graph 0.72 rotate by 90 tc rgb '#2ca02c' font ',8'
plot '/work/main/bench/results/2026-12-03/soak_4x1_rows.dat' using 1:2 with points pt 7 ps 0.2 lc rgb '#bbbbbb' title 'logged steps (all ranks, incl. redone)', '/work/main/bench/results/2026-12-03/soak_4x1_kept.dat' using 1:2 with lines lw 2 lc rgb 'black' title 'kept steps (soak)', '/work/main/bench/results/2026-12-03/soak_4x1_base.dat' using 1:2 with lines lw 1.5 dt 3 lc rgb '#555555' title 'undisturbed run'
